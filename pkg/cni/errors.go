package cni

import (
	"errors"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// errPluginNotAvailable is the spec's code 50, which the types package does
// not name.
const errPluginNotAvailable uint = 50

// codes are the spec's codes of the endpoint's kinds of error.
var codes = map[error]uint{
	endpoint.ErrConfig:      types.ErrInvalidNetworkConfig,
	endpoint.ErrEnv:         types.ErrInvalidEnvironmentVariables,
	endpoint.ErrTryAgain:    types.ErrTryAgainLater,
	endpoint.ErrIO:          types.ErrIOFailure,
	endpoint.ErrDecode:      types.ErrDecodingFailure,
	endpoint.ErrUnavailable: errPluginNotAvailable,
	endpoint.ErrInternal:    types.ErrInternal,
}

// Add, Del, Check, GC and Status are the CNI verbs as skel calls them:
// their errors are CNI errors (cniError).
func Add(args *skel.CmdArgs) error { return cniError(guarded(func() error { return add(args) })) }
func Del(args *skel.CmdArgs) error { return cniError(guarded(func() error { return del(args) })) }
func Check(args *skel.CmdArgs) error {
	return cniError(guarded(func() error { return check(args) }))
}
func GC(args *skel.CmdArgs) error     { return cniError(guarded(func() error { return gc(args) })) }
func Status(args *skel.CmdArgs) error { return cniError(status(args)) }

// guarded runs a verb whose maps open at first use (maps.OpenPinned): a
// pin found wrong then is the datapath unavailable (50), as when the open
// found it.
func guarded(verb func() error) error {
	err := maps.Guard(verb)
	var pe *maps.PinError
	if errors.As(err, &pe) && !errors.Is(err, endpoint.ErrUnavailable) {
		return &endpoint.Error{Kind: endpoint.ErrUnavailable, Err: err}
	}
	return err
}

// cniError is where the verbs' errors become the CNI errors the runtime
// sees, the one place that knows the codes. An error of a kind
// (endpoint.Error, the first found) is its kind's code with its message; a
// delegated plugin's keeps its code and details; anything else is 999.
// Several errors joined (DEL's teardown and IPAM release) are one error
// with all their messages and the code of the first that has a kind.
func cniError(err error) error {
	if err == nil {
		return nil
	}
	return toCNI(err)
}

func toCNI(err error) *types.Error {
	joined, ok := err.(interface{ Unwrap() []error })
	if _, kinded := err.(*endpoint.Error); ok && !kinded {
		return joinedCNI(joined.Unwrap())
	}
	var e *endpoint.Error
	if !errors.As(err, &e) {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	var p *endpoint.PluginError
	if e.Kind == endpoint.ErrDelegated && errors.As(e.Err, &p) {
		return types.NewError(p.Code, e.Error(), p.Details)
	}
	code, ok := codes[e.Kind]
	if !ok {
		code = types.ErrInternal
	}
	return types.NewError(code, e.Error(), "")
}

// joinedCNI is several errors as one: every message, the first kind's code.
func joinedCNI(errs []error) *types.Error {
	var (
		msgs  []string
		first *types.Error
	)
	for _, part := range errs {
		te := toCNI(part)
		msgs = append(msgs, te.Msg)
		if first == nil && errors.As(part, new(*endpoint.Error)) {
			first = te
		}
	}
	if first == nil {
		return types.NewError(types.ErrInternal, strings.Join(msgs, "; "), "")
	}
	return types.NewError(first.Code, strings.Join(msgs, "; "), first.Details)
}
