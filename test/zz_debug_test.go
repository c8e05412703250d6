package test

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

type bytesBuf = bytes.Buffer

func tcpdump(t *testing.T, n ns.NetNS, iface string) func() string {
	var cmd *exec.Cmd
	var out []byte
	done := make(chan struct{})
	n.Do(func(ns.NetNS) error {
		cmd = exec.Command("tcpdump", "-nn", "-vv", "-i", iface, "-l", "-c", "20")
		var b bytesBuf
		cmd.Stdout, cmd.Stderr = &b, &b
		cmd.Start()
		go func() { cmd.Wait(); out = b.Bytes(); close(done) }()
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	return func() string { time.Sleep(300 * time.Millisecond); cmd.Process.Signal(os.Interrupt); <-done; return string(out) }
}

func TestZZDebug(t *testing.T) {
	e := newHPEnv(t)
	p := e.newPod()
	e.mustAddHP(p, "web", pm{HostPort: 8080, ContainerPort: 80, Protocol: "tcp"})
	serve(t, p, 80, "web")
	stopP := tcpdump(t, p, "eth0")
	stopR := tcpdump(t, e.remote, "eth0")
	_, err := askTCP(e.remote, hp(uplinkIP6, 8080))
	t.Logf("ask: %v", err)
	t.Logf("pod:\n%s", stopP())
	t.Logf("remote:\n%s", stopR())
}
