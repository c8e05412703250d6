package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// a15Paws is what netns's TCP refused by PAWS: SYNs on a TIME_WAIT
// (PAWSTimewait) and segments of established connections (PAWSEstab).
// (It lived in attack15_upgrade_test.go, which int13 left out: the
// package did not build without it.)
func a15Paws(t *testing.T, netns ns.NetNS) int64 {
	t.Helper()
	return a15TcpExt(t, netns, "PAWSTimewait") + a15TcpExt(t, netns, "PAWSEstab")
}

// a15TcpExt is netns's TcpExt counter name (/proc/net/netstat), -1 if absent.
func a15TcpExt(t *testing.T, netns ns.NetNS, name string) int64 {
	t.Helper()
	var v int64 = -1
	must(t, netns.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/thread-self/net/netstat")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			k, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if len(k) == 0 || k[0] != "TcpExt:" {
				continue
			}
			for j := range k {
				if k[j] == name && j < len(vals) {
					v, _ = strconv.ParseInt(vals[j], 10, 64)
				}
			}
		}
		return nil
	}))
	return v
}
