package endpoint

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestErrorKinds: each helper gives its kind and keeps the cause for
// errors.Is; the message is the cause's, as the runtime sees it.
func TestErrorKinds(t *testing.T) {
	full := fmt.Errorf("write endpoint to cni_endpoints: %w", maps.ErrFull)
	conflict := fmt.Errorf("route: %w", &conflictError{msg: "10.0.0.0/24 is routed to net1"})
	cause := errors.New("netlink: busy")
	var pe *PluginError
	for _, c := range []struct {
		name  string
		err   error
		kind  error
		cause error
		msg   string
	}{
		{"full map", mapError(full), ErrTryAgain, maps.ErrFull, full.Error()},
		{"other map error", mapError(cause), ErrInternal, cause, cause.Error()},
		{"route conflict", netlinkError(conflict), ErrConfig, nil, "10.0.0.0/24 is routed to net1"},
		{"netlink error", netlinkError(cause), ErrInternal, cause, cause.Error()},
		{"kind kept", internalErr(fmt.Errorf("outer: %w", ConfError("mtu: %w", cause))), ErrConfig, cause, "mtu: netlink: busy"},
		{"internal", internalErr(cause), ErrInternal, cause, cause.Error()},
		{"ipam", IPAMError("host-local", types.NewError(types.ErrTryAgainLater, "no room", "")), ErrDelegated, nil, `ipam plugin "host-local": no room`},
		{"ipam crashed", IPAMError("host-local", cause), ErrInternal, cause, `ipam plugin "host-local": netlink: busy`},
	} {
		var e *Error
		if !errors.As(c.err, &e) || e.Kind != c.kind || !errors.Is(c.err, c.kind) || e.Error() != c.msg {
			t.Errorf("%s: %v (%T), want kind %v, message %q", c.name, c.err, c.err, c.kind, c.msg)
		}
		if c.cause != nil && !errors.Is(c.err, c.cause) {
			t.Errorf("%s: errors.Is lost the cause %v", c.name, c.cause)
		}
	}
	if !errors.As(IPAMError("x", types.NewError(0, "crashed", "")), &pe) || pe.Code != types.ErrInternal {
		t.Errorf("an IPAM error without a code: %+v, want 999", pe)
	}
}
