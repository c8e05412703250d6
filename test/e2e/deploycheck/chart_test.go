package deploycheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The Helm chart renders, with its default values, the objects of the plain
// manifest: one deployment, two ways to apply it. The helm CLI is built from
// its Go module by `make helm` (test/helm/tools); HELM names another one.

const chartDir = deployDir + "/helm/ebpf-cni"

func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	h, err := filepath.Abs("../../../bin/helm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no helm CLI at %s (CI: run `make helm` first): %v", h, err)
		}
		t.Skipf("no helm CLI at %s: run `make helm` (builds it from its Go module) or set HELM", h)
	}
	return h
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return out
}

func render(t *testing.T, set ...string) *manifest {
	t.Helper()
	args := []string{"template", "ebpf-cni", chartDir, "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return parse(t, helm(t, args...), "helm template "+chartDir)
}

func conflistOf(t *testing.T, m *manifest) map[string]any {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal([]byte(m.configMap.Data[conflistKey]), &c); err != nil {
		t.Fatalf("conflist in ConfigMap: %v", err)
	}
	return c
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestChartLint(t *testing.T) {
	out := helm(t, "lint", "--strict", chartDir)
	t.Logf("%s", out)
}

func TestChartMatchesManifest(t *testing.T) {
	want := load(t)
	got := render(t)

	pairs := []struct {
		kind      string
		got, want any
	}{
		{"ServiceAccount", got.sa, want.sa},
		{"ClusterRole", got.role, want.role},
		{"ClusterRoleBinding", got.binding, want.binding},
	}
	for _, p := range pairs {
		if !reflect.DeepEqual(p.got, p.want) {
			t.Errorf("%s differs:\nchart:\n%s\nmanifest:\n%s", p.kind, asJSON(t, p.got), asJSON(t, p.want))
		}
	}

	// The conflist is JSON inside a string: compared as data, not text.
	if g, w := conflistOf(t, got), conflistOf(t, want); !reflect.DeepEqual(g, w) {
		t.Errorf("conflist differs:\nchart:    %v\nmanifest: %v", g, w)
	}
	gcm, wcm := *got.configMap, *want.configMap
	gcm.Data, wcm.Data = nil, nil
	if !reflect.DeepEqual(gcm, wcm) {
		t.Errorf("ConfigMap metadata differs:\nchart:\n%s\nmanifest:\n%s", asJSON(t, gcm), asJSON(t, wcm))
	}

	// The chart adds a checksum of the conflist to the pod template, so a
	// changed value rolls the agents: the only difference allowed.
	ds := got.daemonSet.DeepCopy()
	if ds.Spec.Template.Annotations["checksum/config"] == "" {
		t.Errorf("chart DaemonSet lacks the checksum/config annotation")
	}
	delete(ds.Spec.Template.Annotations, "checksum/config")
	if len(ds.Spec.Template.Annotations) == 0 {
		ds.Spec.Template.Annotations = nil
	}
	if !reflect.DeepEqual(ds, want.daemonSet) {
		t.Errorf("DaemonSet differs:\nchart:\n%s\nmanifest:\n%s", asJSON(t, ds), asJSON(t, want.daemonSet))
	}
}

// Values reach the objects they name, and only those.
func TestChartValues(t *testing.T) {
	m := render(t,
		"image.repository=registry.example/ebpf-cni", "image.tag=v9",
		"cni.ipMasq=false", "cni.maxPods=250", "cni.mtu=1450", "cni.maxHostPortsPerPod=8",
		"cni.hostPorts=false", "agent.clusterCIDRs={10.0.0.0/8,fd00::/48}", "agent.metricsAddr=",
		"tunnel.mode=vxlan", "tunnel.hybrid=true", "tunnel.macCheck=false",
	)
	plugin := conflistOf(t, m)["plugins"].([]any)[0].(map[string]any)
	for k, want := range map[string]any{"ipMasq": false, "maxPods": 250.0, "mtu": 1450.0, "maxHostPortsPerPod": 8.0} {
		if plugin[k] != want {
			t.Errorf("conflist %s = %v, want %v", k, plugin[k], want)
		}
	}
	if caps := plugin["capabilities"].(map[string]any); caps["portMappings"] != nil || caps["bandwidth"] != true {
		t.Errorf("capabilities = %v, want bandwidth only", caps)
	}
	spec := m.daemonSet.Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != "registry.example/ebpf-cni:v9" {
			t.Errorf("container %s image %q", c.Name, c.Image)
		}
	}
	args := strings.Join(container(t, spec.Containers, "agent").Args, " ")
	for _, want := range []string{"--cluster-cidrs=10.0.0.0/8,fd00::/48", "--metrics-addr=", "--tunnel=vxlan", "--tunnel-hybrid", "--tunnel-mac-check=false"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %q", args, want)
		}
	}
	// By default the agent writes the pods' MTU (the uplink's less the
	// tunnel's overhead) and routes host-gw.
	def := render(t)
	if mtu, set := conflistOf(t, def)["plugins"].([]any)[0].(map[string]any)["mtu"]; set {
		t.Errorf("default conflist sets mtu %v; the agent should", mtu)
	}
	if args := strings.Join(container(t, def.daemonSet.Spec.Template.Spec.Containers, "agent").Args, " "); strings.Contains(args, "--tunnel") {
		t.Errorf("default agent args %q name a tunnel", args)
	}
	// The MAC check is on unless turned off, and only a tunnel has one.
	for _, vals := range [][]string{{"tunnel.mode=vxlan"}, {"tunnel.macCheck=false"}} {
		if args := strings.Join(container(t, render(t, vals...).daemonSet.Spec.Template.Spec.Containers, "agent").Args, " "); strings.Contains(args, "--tunnel-mac-check") {
			t.Errorf("agent args %q with %v name the MAC check", args, vals)
		}
	}
	// A changed conflist changes the checksum, so the DaemonSet rolls.
	if a, b := m.daemonSet.Spec.Template.Annotations["checksum/config"], render(t).daemonSet.Spec.Template.Annotations["checksum/config"]; a == b {
		t.Errorf("checksum/config did not change with the conflist (%s)", a)
	}
}

// The features of this round: NetworkPolicy off takes away its RBAC, its
// conflist key and its agent flag; observe and uninstall-on-stop reach the
// agent and the ConfigMap.
func TestChartFeatureValues(t *testing.T) {
	m := render(t, "networkPolicy.enabled=false", "observe.flowEvents=node", "observe.dropEvents=false", "uninstallOnStop=force")
	for _, r := range m.role.Rules {
		for _, res := range r.Resources {
			if res != "nodes" {
				t.Errorf("networkPolicy off: ClusterRole still grants %s", res)
			}
		}
	}
	plugin := conflistOf(t, m)["plugins"].([]any)[0].(map[string]any)
	if _, ok := plugin["networkPolicy"]; ok {
		t.Errorf("networkPolicy off: the conflist still has networkPolicy")
	}
	args := strings.Join(container(t, m.daemonSet.Spec.Template.Spec.Containers, "agent").Args, " ")
	if strings.Contains(args, "--network-policy") {
		t.Errorf("networkPolicy off: agent args %q", args)
	}
	for _, want := range []string{"--flow-events=node", "--drop-events=false", "--uninstall-on-stop="} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %q", args, want)
		}
	}
	if got := m.configMap.Data["uninstall-on-stop"]; got != "force" {
		t.Errorf("ConfigMap uninstall-on-stop = %q, want force", got)
	}
	if d := render(t).configMap.Data; d["uninstall-on-stop"] != "" {
		t.Errorf("default ConfigMap has uninstall-on-stop %q: stopping the agents would uninstall", d["uninstall-on-stop"])
	}
}
