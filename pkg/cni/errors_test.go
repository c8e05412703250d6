package cni

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ebpf-cni/ebpf-cni/pkg/endpoint"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// TestCNIError: each kind is its code with its own message; a delegated
// plugin's code and details are kept; a kind wrapped further keeps its code
// and message; joined errors are every message and the first kind's code;
// errors.Is still finds the cause.
func TestCNIError(t *testing.T) {
	full := fmt.Errorf("write endpoint to cni_endpoints: %w", maps.ErrFull)
	ipam := endpoint.IPAMError("host-local", types.NewError(types.ErrTryAgainLater, "no room", "range full"))
	for _, c := range []struct {
		name    string
		err     error
		code    uint
		msg     string
		details string
	}{
		{"conf", endpoint.ConfError("mtu %d is too small", 10), types.ErrInvalidNetworkConfig, "mtu 10 is too small", ""},
		{"env", endpoint.Errorf(endpoint.ErrEnv, "CNI_NETNS %q", "/x"), types.ErrInvalidEnvironmentVariables, `CNI_NETNS "/x"`, ""},
		{"unavailable", endpoint.Errorf(endpoint.ErrUnavailable, "datapath"), errPluginNotAvailable, "datapath", ""},
		{"plain", errors.New("boom"), types.ErrInternal, "boom", ""},
		{"wrapped kind", fmt.Errorf("outer: %w", endpoint.Errorf(endpoint.ErrIO, "stateDir")), types.ErrIOFailure, "stateDir", ""},
		{"ipam", ipam, types.ErrTryAgainLater, `ipam plugin "host-local": no room`, "range full"},
		{"joined", errors.Join(errors.New("open datapath"), endpoint.Errorf(endpoint.ErrTryAgain, "busy: %w", full), ipam),
			types.ErrTryAgainLater, "open datapath; busy: write endpoint to cni_endpoints: map is full; " + `ipam plugin "host-local": no room`, ""},
		{"joined plain", errors.Join(errors.New("a"), errors.New("b")), types.ErrInternal, "a; b", ""},
	} {
		var te *types.Error
		if !errors.As(cniError(c.err), &te) || te.Code != c.code || te.Msg != c.msg || te.Details != c.details {
			t.Errorf("%s: %+v, want code %d, message %q, details %q", c.name, te, c.code, c.msg, c.details)
		}
	}
	if cniError(nil) != nil {
		t.Error("cniError(nil) is not nil")
	}
	e := endpoint.Errorf(endpoint.ErrTryAgain, "busy: %w", full)
	if !errors.Is(e, endpoint.ErrTryAgain) || !errors.Is(e, maps.ErrFull) {
		t.Errorf("%v: errors.Is lost the kind or the cause", e)
	}
}
