package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/ebpf-cni/ebpf-cni/test/testenv"
)

// runTunnel is the tunnel part: cross-node pod-to-pod throughput and
// request/response, VXLAN tunnel against host-gw. It lives in the
// integration tests' tunnel lab (three node namespaces behind a router:
// test/integration/tunnel_bench_test.go, `make bench-tunnel`), so it runs
// that test and takes its rows: in the lab whose two nodes share both
// CPUs, then (-tunnel-node-cpus) in the one that gives each node a CPU of
// its own, as real nodes have (docs/performance.md, round 13).
func runTunnel(ctx context.Context, o *options) ([]testenv.Row, error) {
	if _, err := os.Stat(filepath.Join("test", "integration")); err != nil {
		return nil, fmt.Errorf("tunnel part: run from the repository's root (test/integration): %w", err)
	}
	labs := []bool{false}
	if o.tunnelNodeCPUs {
		labs = append(labs, true)
	}
	var rows []testenv.Row
	for _, nodeCPUs := range labs {
		r, err := runTunnelLab(ctx, o, nodeCPUs)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// runTunnelLab runs TestTunnelBench once in one lab and returns its rows.
func runTunnelLab(ctx context.Context, o *options, nodeCPUs bool) ([]testenv.Row, error) {
	out, err := os.CreateTemp("", "ebpfbench-tunnel-*.json")
	if err != nil {
		return nil, err
	}
	out.Close()
	defer os.Remove(out.Name())
	rounds := "7"
	if o.quick {
		rounds = "3"
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-tags", "tunnelbench", "-count=1", "-run", "^TestTunnelBench$", "-v", "./test/integration/")
	// The test's own harness (testenv.Main), not the benchmark's re-exec.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, testenv.InnerEnv+"=") && !strings.HasPrefix(kv, testenv.CmdlineEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "TUNNEL_BENCH_OUT="+out.Name(), "TUNNEL_BENCH_ROUNDS="+rounds)
	if nodeCPUs {
		cmd.Env = append(cmd.Env, "TUNNEL_BENCH_NODE_CPUS=1")
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	logf("tunnel: %s (%s rounds)", strings.Join(cmd.Args, " "), rounds)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("tunnel part: %v", err)
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return nil, err
	}
	var rows []testenv.Row
	if err := json.Unmarshal(b, &rows); err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("tunnel part: no rows from the test (%v)", err)
	}
	return rows, nil
}
