package events

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
)

// ErrNoAgent is wrapped by a client call that found no agent on the socket.
var ErrNoAgent = errors.New("no agent is running")

func client(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

func get(ctx context.Context, socket, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client(socket).Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (no socket answers at %s)", ErrNoAgent, socket)
		}
		return nil, fmt.Errorf("ask the agent at %s: %w", socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("the agent at %s: %s", socket, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// Observe asks the agent on socket for the records of q and calls fn with
// each until the stream ends (not following: after the last kept record),
// ctx ends or fn fails.
func Observe(ctx context.Context, socket string, q Query, fn func(*Record) error) error {
	resp, err := get(ctx, socket, "/v1/events?"+q.values().Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("the agent's answer: %w", err)
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("read the agent's answer: %w", err)
	}
	return nil
}

// AgentStatus asks the agent on socket for its events status.
func AgentStatus(ctx context.Context, socket string) (Status, error) {
	var st Status
	resp, err := get(ctx, socket, "/v1/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}
