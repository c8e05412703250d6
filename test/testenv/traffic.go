package testenv

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Ping sends count ICMP echoes from netns to ip with the system Ping.
func Ping(netns ns.NetNS, ip net.IP, count int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping %s: %v\n%s", ip, err, out)
		}
		return nil
	})
}

// TCPTransfer sends n random bytes from src to a listener in dst on ip and
// checks that the same bytes arrive.
func TCPTransfer(src, dst ns.NetNS, ip net.IP, n int) error {
	return TCPTransferPort(src, dst, ip, 0, n)
}

// TCPTransferPort is tcpTransfer to a listener on port (0: any).
func TCPTransferPort(src, dst ns.NetNS, ip net.IP, lport, n int) error {
	var ln net.Listener
	err := dst.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(lport)))
		return err
	})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", ip, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	payload := make([]byte, n)
	rand.Read(payload)
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	err = src.Do(func(ns.NetNS) error {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", net.JoinHostPort(ip.String(), fmt.Sprint(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		_, err = c.Write(payload)
		return err
	})
	if err != nil {
		return fmt.Errorf("send to %s: %w", ip, err)
	}
	b := <-got
	if !bytes.Equal(b, payload) {
		return fmt.Errorf("received %d bytes, want the %d sent", len(b), n)
	}
	return nil
}

// PodReachable proves a pod still works both ways over both families.
func (e *Env) PodReachable(t *testing.T, pod ns.NetNS, ips []net.IP) {
	t.Helper()
	for _, ip := range ips {
		if err := Ping(e.Node, ip, 2); err != nil {
			t.Fatalf("node to pod %s: %v", ip, err)
		}
	}
	if err := Ping(pod, NodeIP4, 2); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
	if err := Ping(pod, NodeIP6, 2); err != nil {
		t.Fatalf("pod to node: %v", err)
	}
}

// ---- 1. Retried ADD --------------------------------------------------------

// PingFrom pings from a given source address.
func PingFrom(netns ns.NetNS, src, ip net.IP, count int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", fmt.Sprint(count), "-i", "0.2", "-W", "2", "-I", src.String(), ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping -I %s %s: %v\n%s", src, ip, err, out)
		}
		return nil
	})
}

// PingDF pings with a payload of size bytes and fragmentation prohibited.
func PingDF(netns ns.NetNS, ip net.IP, size int) error {
	return netns.Do(func(ns.NetNS) error {
		args := []string{"-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", fmt.Sprint(size), ip.String()}
		if ip.To4() == nil {
			args = append([]string{"-6"}, args...)
		}
		out, err := exec.Command("ping", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping -M do -s %d %s: %v\n%s", size, ip, err, out)
		}
		return nil
	})
}
