package endpoint

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Every error the endpoint returns for the runtime to see is an *Error: a
// kind (one of the sentinels below, errors.Is finds it) and a message
// naming the field or resource. pkg/cni maps the kinds to the spec's codes
// (cni.Error), in one place; the agent tests kinds with errors.Is.
var (
	ErrConfig      = errors.New("invalid network configuration")       // 7
	ErrEnv         = errors.New("invalid CNI_* environment variables") // 4
	ErrTryAgain    = errors.New("try again later")                     // 11
	ErrIO          = errors.New("I/O failure")                         // 74
	ErrDecode      = errors.New("decoding failure")                    // 6
	ErrUnavailable = errors.New("plugin not available")                // 50: the datapath or a node hook cannot be used
	ErrInternal    = errors.New("internal error")                      // 999
	// ErrDelegated is a delegated (IPAM) plugin's own error: its code is the
	// plugin's (see PluginError).
	ErrDelegated = errors.New("delegated plugin failed")
)

// Error is an error of a Kind. Its message is Err's; errors.Is finds both
// the kind and whatever Err wraps (maps.ErrFull, ebpf.ErrKeyNotExist, ...).
type Error struct {
	Kind error // one of the sentinels above
	Err  error
}

func (e *Error) Error() string   { return e.Err.Error() }
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// Errorf is an error of kind kind; format may use %w.
func Errorf(kind error, format string, a ...any) error {
	return &Error{Kind: kind, Err: fmt.Errorf(format, a...)}
}

// OpenError is what a teardown makes of opening the node's maps at pinDir:
// nil when they were never set up (nothing of any pod in them), else the
// datapath unavailable (50), naming the pin this build cannot use, as
// ADD's and CHECK's opens answer.
func OpenError(pinDir string, err error) error {
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return Errorf(ErrUnavailable, "open datapath at %s: %w", pinDir, err)
}

// ConfError is an invalid network configuration (code 7).
func ConfError(format string, a ...any) error { return Errorf(ErrConfig, format, a...) }

// internal is an internal error (999).
func internal(format string, a ...any) error { return Errorf(ErrInternal, format, a...) }

// internalErr is err as an internal error, unless it has a kind already.
func internalErr(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: ErrInternal, Err: err}
}

// mapError is a failed map write: a full map is try again later (it has
// room again once pods go), anything else internal.
func mapError(err error) error {
	if errors.Is(err, maps.ErrFull) {
		return &Error{Kind: ErrTryAgain, Err: err}
	}
	return &Error{Kind: ErrInternal, Err: err}
}

// conflictError: the pod or the node already routes what this ADD needs to
// another interface; nothing of that interface is touched.
type conflictError struct{ msg string }

func (e *conflictError) Error() string { return e.msg }

// netlinkError: a route another interface holds is a configuration error
// (two networks configured to overlap), anything else internal.
func netlinkError(err error) error {
	var c *conflictError
	if errors.As(err, &c) {
		return &Error{Kind: ErrConfig, Err: c}
	}
	return &Error{Kind: ErrInternal, Err: err}
}

// PluginError is the error a delegated plugin returned, with its code.
type PluginError struct {
	Code         uint
	Msg, Details string
}

func (e *PluginError) Error() string { return e.Msg }

// IPAMError keeps the IPAM plugin's error code and says who failed. A
// plugin that crashed or printed no error has no code (libcni reports 0,
// which is success's): that is an internal error.
func IPAMError(plugin string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		code := te.Code
		if code == 0 {
			code = types.ErrInternal
		}
		return &Error{Kind: ErrDelegated, Err: &PluginError{Code: code, Msg: fmt.Sprintf("ipam plugin %q: %s", plugin, te.Msg), Details: te.Details}}
	}
	if strings.Contains(err.Error(), "failed to find plugin") {
		return ConfError("ipam.type: %w (is it in CNI_PATH?)", err)
	}
	return Errorf(ErrInternal, "ipam plugin %q: %w", plugin, err)
}

// checkError is a CHECK finding: the attachment is not as ADD left it.
func checkError(format string, a ...any) error {
	return Errorf(ErrInternal, format, a...)
}

func notExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return errors.New("missing")
	}
	return err
}
