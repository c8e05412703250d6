package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
)

// uninstallCNI is the harness step of issue 31: the DaemonSet's cleanup
// mode on both nodes. It sets the ConfigMap's uninstall-on-stop to "force"
// (e2e pods may remain), waits until every agent logs it, deletes the
// DaemonSet as a user would (kubectl delete -f deploy/ebpf-cni.yaml), and
// checks each node: no pin directory, no conflist, no route of protocol
// 199, and none of the socket hooks the nodes had pinned (ids, taken with
// ourCgroupProgs before the step: the pins are gone after it) still on the
// cgroup2 root.
//
// run() calls it after the suite with -uninstall, once c.cgProgsOurs is
// taken (the pins are gone after it).
func (c *cluster) uninstallCNI(ctx context.Context, ids map[uint32]bool) error {
	if c.o.cni != "ebpf-cni" {
		return nil
	}
	if _, err := c.kubectl("-n", "kube-system", "patch", "configmap", "ebpf-cni-config", "--type", "merge",
		"-p", `{"data":{"uninstall-on-stop":"force"}}`); err != nil {
		return fmt.Errorf("set uninstall-on-stop: %w", err)
	}
	if err := c.waitFor(ctx, "every agent sees uninstall-on-stop: force", 4*time.Minute, func() error {
		for _, n := range c.nodes {
			pod, err := c.kubectl("-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ebpf-cni",
				"--field-selector", "spec.nodeName="+n.name, "-o", "jsonpath={.items[0].metadata.name}")
			if err != nil {
				return err
			}
			logs, err := c.kubectl("-n", "kube-system", "logs", pod, "-c", "agent")
			if err != nil {
				return err
			}
			if !strings.Contains(logs, "uninstall-on-stop: force") {
				return fmt.Errorf("%s: the agent has not seen the key yet", n.name)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if _, err := c.kubectl("delete", "--wait=true", "--timeout=3m", "-f", filepath.Join(c.o.repo, "deploy/ebpf-cni.yaml")); err != nil {
		return fmt.Errorf("delete the DaemonSet: %w", err)
	}
	for _, n := range c.nodes {
		if err := c.waitFor(ctx, n.name+": nothing of ebpf-cni left", time.Minute, func() error {
			if out, err := in(n.holder, true, "ls", datapath.DefaultPinRoot); err == nil {
				return fmt.Errorf("pin directory left: %s", out)
			}
			if out, err := in(n.holder, true, "ls", "/etc/cni/net.d/10-ebpf-cni.conflist"); err == nil {
				return fmt.Errorf("conflist left: %s", out)
			}
			for _, fam := range []string{"-4", "-6"} {
				out, err := in(n.holder, false, "ip", fam, "route", "show", "proto", "199")
				if err != nil {
					return err
				}
				if strings.TrimSpace(out) != "" {
					return fmt.Errorf("routes of proto 199 left:\n%s", out)
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for id := range attachedIDs() {
		if ids[id] {
			return fmt.Errorf("socket hook program %d of the nodes still on the cgroup2 root after the uninstall", id)
		}
	}
	logf("uninstall: DaemonSet deleted with uninstall-on-stop force; no pin directory, conflist, proto 199 route or socket hook left on %d nodes", len(c.nodes))
	return nil
}
