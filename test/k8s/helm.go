package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// buildHelm builds the helm CLI from its Go module at the version
// test/helm/tools pins (as make helm does), cached by that pin.
func buildHelm(ctx context.Context, o options, a *artifacts) error {
	tools := filepath.Join(o.repo, "test/helm/tools")
	sum, err := os.ReadFile(filepath.Join(tools, "go.sum"))
	if err != nil {
		return err
	}
	h := sha256.Sum256(sum)
	dir := filepath.Join(o.cache, "helm-"+hex.EncodeToString(h[:4]))
	if err := cached(ctx, dir, "helm ("+tools+")", func(tmp string) error {
		return goCmd(ctx, tools, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", tmp+"/helm", "helm.sh/helm/v3/cmd/helm")
	}); err != nil {
		return err
	}
	a.bin["helm"] = filepath.Join(dir, "helm")
	return nil
}

// helmInstall installs deploy/helm/ebpf-cni with its default values (the
// image the nodes have imported) into kube-system, as a user's `helm
// install` would, from the control-plane namespace; helm's own state goes
// to the run's work directory.
func (c *cluster) helmInstall() error {
	home := filepath.Join(c.work, "helm")
	args := []string{"nsenter", "-t", strconv.Itoa(c.cp.cmd.Process.Pid), "-n", "--",
		"env", "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config", "HELM_DATA_HOME=" + home + "/data",
		c.a.path("helm"), "install", "ebpf-cni", filepath.Join(c.o.repo, "deploy/helm/ebpf-cni"),
		"--namespace", "kube-system", "--kubeconfig", c.admin}
	args = append(args, c.helmTunnelValues()...)
	out, err := sh(args...)
	if err != nil {
		return fmt.Errorf("helm install: %w", err)
	}
	logf("helm install ebpf-cni deploy/helm/ebpf-cni --namespace kube-system: %s", firstLine(out))
	return nil
}

func firstLine(s string) string {
	for i, r := range s {
		if r == '\n' {
			return s[:i]
		}
	}
	return s
}
