package testenv

import (
	"net"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// RRMedian is the median round trip, in µs, of count 1-byte exchanges over
// one TCP connection (Nagle off) from client to a server it starts in srv
// on addr:port: request/response latency, which a throughput run hides.
func RRMedian(client, srv ns.NetNS, addr net.IP, port, count int) (float64, error) {
	hp := net.JoinHostPort(addr.String(), strconv.Itoa(port))
	var ln net.Listener
	if err := srv.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", hp)
		return err
	}); err != nil {
		return 0, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.(*net.TCPConn).SetNoDelay(true)
		buf := make([]byte, 1)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	if err := client.Do(func(ns.NetNS) error {
		var err error
		c, err = net.DialTimeout("tcp", hp, 5*time.Second)
		return err
	}); err != nil {
		return 0, err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	c.SetDeadline(time.Now().Add(time.Minute))
	buf := []byte{'x'}
	rtts := make([]float64, 0, count)
	for i := 0; i < count; i++ {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := c.Read(buf); err != nil {
			return 0, err
		}
		rtts = append(rtts, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	return Median(rtts), nil
}
