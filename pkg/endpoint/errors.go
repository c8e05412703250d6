package endpoint

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// Every error the endpoint returns is a CNI error with the spec's code and
// a message naming the field or resource.

// ErrPluginNotAvailable is the spec's code 50, which the types package does
// not name: the datapath (or a node hook) cannot be used.
const ErrPluginNotAvailable uint = 50

// ConfError is error 7, invalid network configuration.
func ConfError(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, a...), "")
}

// internal is error 999.
func internal(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, a...), "")
}

// internalErr is err as error 999, unless it is a CNI error already.
func internalErr(err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// mapError is a failed map write: a full map is code 11 (it has room again
// once pods go), anything else internal.
func mapError(err error) error {
	if errors.Is(err, maps.ErrFull) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// conflictError: the pod or the node already routes what this ADD needs to
// another interface; nothing of that interface is touched.
type conflictError struct{ msg string }

func (e *conflictError) Error() string { return e.msg }

// netlinkError: a route another interface holds is code 7 (two networks
// configured to overlap), anything else internal.
func netlinkError(err error) error {
	var c *conflictError
	if errors.As(err, &c) {
		return ConfError("%s", c.msg)
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

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
		return types.NewError(code, fmt.Sprintf("ipam plugin %q: %s", plugin, te.Msg), te.Details)
	}
	if strings.Contains(err.Error(), "failed to find plugin") {
		return ConfError("ipam.type: %v (is it in CNI_PATH?)", err)
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("ipam plugin %q: %v", plugin, err), "")
}

// checkError is a CHECK finding: the attachment is not as ADD left it.
func checkError(format string, a ...any) error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, a...), "")
}

func notExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return errors.New("missing")
	}
	return err
}
