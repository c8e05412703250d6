package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoKubernetesClient: the plugin is exec'd for every pod and must stay
// small; only the agent follows the cluster (pkg/nodes), so no Kubernetes
// API package may reach this binary through an import. Nor may the
// iptables/nftables helpers of containernetworking/plugins (pkg/ip,
// pkg/utils): the plugin never uses them, and their package
// initialisation ran in every verb (issue 30).
func TestNoKubernetesClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"k8s.io/client-go", "k8s.io/api/", "k8s.io/apimachinery", "github.com/ebpf-cni/ebpf-cni/pkg/nodes", "github.com/ebpf-cni/ebpf-cni/pkg/agent",
			"sigs.k8s.io/knftables", "github.com/coreos/go-iptables", "github.com/containernetworking/plugins/pkg/utils"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("the plugin imports %s", p)
			}
		}
	}
}
