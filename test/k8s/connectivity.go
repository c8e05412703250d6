package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// runConnectivity runs the built `ebpf-agent connectivity` from the
// control-plane namespace (as a user's kubectl would reach the cluster) with
// the agnhost image the nodes already have, and keeps its table.
func (c *cluster) runConnectivity(ctx context.Context) error {
	args := []string{"-t", strconv.Itoa(c.cp.cmd.Process.Pid), "-n", "--",
		c.a.path("ebpf-agent"), "connectivity", "--kubeconfig", c.admin, "--image", agnhostImage}
	if c.o.connPolicy {
		args = append(args, "--policy")
	}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	out, err := cmd.CombinedOutput()
	path := filepath.Join(c.o.out, "connectivity.txt")
	if werr := os.WriteFile(path, out, 0o644); werr != nil {
		logf("write %s: %v", path, werr)
	}
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		logf("  %s", l)
	}
	if err != nil {
		return fmt.Errorf("ebpf-agent connectivity: %w (table: %s)", err, path)
	}
	return nil
}
