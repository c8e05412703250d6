// Package deploycheck validates deploy/ebpf-cni.yaml offline: every document
// decodes strictly (unknown or duplicate fields fail) into the typed objects
// of k8s.io/api, and the DaemonSet keeps the rules the deployment relies on
// (capabilities, mounts, tolerations, priority, the installer's paths, a
// conflist containerd 1.6 accepts). A module of its own, so the Kubernetes
// API modules stay out of the plugin's go.mod.
//
//	cd test/e2e/deploycheck && go test ./...
//	go test ./... -args -conflist-out=/tmp/x.conflist   # also writes the ConfigMap's conflist
package deploycheck

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var conflistOut = flag.String("conflist-out", "", "write the ConfigMap's conflist to this file")

const (
	deployDir    = "../../../deploy"
	manifestPath = deployDir + "/ebpf-cni.yaml"
	namespace    = "kube-system"
	conflistKey  = "10-ebpf-cni.conflist"
	agentPath    = "/usr/local/bin/ebpf-agent"
	installPath  = "/usr/local/bin/install-cni"
	cniBinSrc    = "/opt/ebpf-cni/cni-bin" // install-cni's default -bin-src
	defaultPin   = "/sys/fs/bpf/ebpf-cni"  // the plugin's default pinDir
)

// The capabilities the agent needs, measured: BPF (maps), NET_ADMIN (tc
// programs), PERFMON (the verifier's pointer rules). make e2e runs the agent
// with exactly this set.
var agentCaps = []string{"BPF", "NET_ADMIN", "PERFMON"}

type manifest struct {
	sa          *corev1.ServiceAccount
	role        *rbacv1.ClusterRole
	binding     *rbacv1.ClusterRoleBinding
	configMap   *corev1.ConfigMap
	daemonSet   *appsv1.DaemonSet
	kinds       []string
	decodeError []string
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func load(t *testing.T) *manifest {
	t.Helper()
	raw, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, raw, manifestPath)
}

// parse decodes a multi-document manifest (the plain one, or what the Helm
// chart renders) strictly into the typed objects.
func parse(t *testing.T, raw []byte, source string) *manifest {
	t.Helper()
	m := &manifest{}
	for i, doc := range docSep.Split(string(raw), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		want := map[string]string{
			"ServiceAccount": "v1", "ConfigMap": "v1", "DaemonSet": "apps/v1",
			"ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
		}[tm.Kind]
		if want == "" {
			t.Errorf("document %d: unexpected kind %q", i, tm.Kind)
			continue
		}
		if tm.APIVersion != want {
			t.Errorf("document %d: %s has apiVersion %q, want %q", i, tm.Kind, tm.APIVersion, want)
		}
		var obj any
		switch tm.Kind {
		case "ServiceAccount":
			m.sa = &corev1.ServiceAccount{}
			obj = m.sa
		case "ClusterRole":
			m.role = &rbacv1.ClusterRole{}
			obj = m.role
		case "ClusterRoleBinding":
			m.binding = &rbacv1.ClusterRoleBinding{}
			obj = m.binding
		case "ConfigMap":
			m.configMap = &corev1.ConfigMap{}
			obj = m.configMap
		case "DaemonSet":
			m.daemonSet = &appsv1.DaemonSet{}
			obj = m.daemonSet
		}
		if slices.Contains(m.kinds, tm.Kind) {
			t.Errorf("document %d: a second %s", i, tm.Kind)
		}
		m.kinds = append(m.kinds, tm.Kind)
		// Strict: a misspelt or misplaced field is an error, not silently dropped.
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Errorf("document %d (%s): %v", i, tm.Kind, err)
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet"} {
		if !slices.Contains(m.kinds, k) {
			t.Fatalf("no %s in %s", k, source)
		}
	}
	return m
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestStrictDecode(t *testing.T) {
	m := load(t)
	t.Logf("decoded %s", strings.Join(m.kinds, ", "))
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func TestDaemonSetRules(t *testing.T) {
	m := load(t)
	ds := m.daemonSet
	spec := ds.Spec.Template.Spec

	for _, meta := range []metav1.ObjectMeta{m.sa.ObjectMeta, m.configMap.ObjectMeta, ds.ObjectMeta} {
		if meta.Namespace != namespace {
			t.Errorf("%s: namespace %q, want %s", meta.Name, meta.Namespace, namespace)
		}
	}
	if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchLabels) == 0 {
		t.Fatal("selector: missing")
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template's labels %v", k, v, ds.Spec.Template.Labels)
		}
	}
	if !spec.HostNetwork {
		t.Error("hostNetwork: want true (the agent works on the node's links)")
	}
	if spec.HostPID || spec.HostIPC {
		t.Error("hostPID/hostIPC: not needed, want false")
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %q, want ClusterFirstWithHostNet with hostNetwork", spec.DNSPolicy)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	tolerateAll := false
	for _, tol := range spec.Tolerations {
		if tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == "" {
			tolerateAll = true
		}
	}
	if !tolerateAll {
		t.Errorf("tolerations %v: want one {operator: Exists} (every taint)", spec.Tolerations)
	}
	if spec.ServiceAccountName != m.sa.Name {
		t.Errorf("serviceAccountName %q, want %q", spec.ServiceAccountName, m.sa.Name)
	}

	// Volumes: every mount has a volume, every volume is mounted, hostPaths are the node's.
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	used := map[string]bool{}
	all := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		for _, vm := range c.VolumeMounts {
			if _, ok := vols[vm.Name]; !ok {
				t.Errorf("container %s mounts unknown volume %q", c.Name, vm.Name)
			}
			used[vm.Name] = true
			if vm.MountPropagation != nil && *vm.MountPropagation == corev1.MountPropagationBidirectional {
				t.Errorf("container %s: Bidirectional propagation on %s needs privileged", c.Name, vm.MountPath)
			}
		}
		if c.Image != spec.Containers[0].Image {
			t.Errorf("container %s: image %q differs from %q", c.Name, c.Image, spec.Containers[0].Image)
		}
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("container %s: no securityContext", c.Name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s: privileged", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: allowPrivilegeEscalation: want false", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s: readOnlyRootFilesystem: want true", c.Name)
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: capabilities.drop: want [ALL]", c.Name)
		}
	}
	for name := range vols {
		if !used[name] {
			t.Errorf("volume %q is not mounted", name)
		}
	}
	hostPath := func(name string) string {
		v, ok := vols[name]
		if !ok || v.HostPath == nil {
			t.Errorf("volume %q: want a hostPath", name)
			return ""
		}
		return v.HostPath.Path
	}
	mountOf := func(c *corev1.Container, path string) *corev1.VolumeMount {
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == path {
				return &c.VolumeMounts[i]
			}
		}
		t.Errorf("container %s: nothing mounted at %s", c.Name, path)
		return nil
	}

	// install-cni: no capability at all, the node's CNI bin dir; the
	// conflist is the agent's (-conf-src "").
	inst := container(t, spec.InitContainers, "install-cni")
	if !slices.Equal(inst.Command, []string{installPath}) {
		t.Errorf("install-cni command %v, want [%s]", inst.Command, installPath)
	}
	if !slices.Equal(inst.Args, []string{"-conf-src", ""}) {
		t.Errorf("install-cni args %q, want [-conf-src \"\"] (the agent writes the conflist)", inst.Args)
	}
	if c := inst.SecurityContext.Capabilities; c != nil && len(c.Add) > 0 {
		t.Errorf("install-cni adds capabilities %v: it needs none", c.Add)
	}
	if vm := mountOf(inst, "/host/opt/cni/bin"); vm != nil && hostPath(vm.Name) != "/opt/cni/bin" {
		t.Errorf("install-cni /host/opt/cni/bin: hostPath %q, want /opt/cni/bin", hostPath(vm.Name))
	}

	// agent: exactly the measured capabilities, host bpffs and cgroup2.
	agent := container(t, spec.Containers, "agent")
	if !slices.Equal(agent.Command, []string{agentPath}) || len(agent.Args) == 0 || agent.Args[0] != "run" {
		t.Errorf("agent: command %v args %v, want [%s] [run ...]", agent.Command, agent.Args, agentPath)
	}
	var add []string
	for _, c := range agent.SecurityContext.Capabilities.Add {
		add = append(add, strings.TrimPrefix(string(c), "CAP_"))
	}
	sort.Strings(add)
	if !slices.Equal(add, agentCaps) {
		t.Errorf("agent capabilities.add %v, want exactly %v", add, agentCaps)
	}
	if vm := mountOf(agent, "/sys/fs/bpf"); vm != nil {
		if hostPath(vm.Name) != "/sys/fs/bpf" {
			t.Errorf("agent /sys/fs/bpf: hostPath %q", hostPath(vm.Name))
		}
		if vm.MountPropagation == nil || *vm.MountPropagation != corev1.MountPropagationHostToContainer {
			t.Error("agent /sys/fs/bpf: want mountPropagation HostToContainer")
		}
	}
	for mount, host := range map[string]string{"/etc/cni/net.d": "/etc/cni/net.d", "/opt/cni/bin": "/opt/cni/bin", "/var/lib/cni": "/var/lib/cni"} {
		if vm := mountOf(agent, mount); vm != nil && hostPath(vm.Name) != host {
			t.Errorf("agent %s: hostPath %q, want %s (reconciliation)", mount, hostPath(vm.Name), host)
		}
	}
	if vm := mountOf(agent, "/sys/fs/cgroup"); vm != nil {
		if hostPath(vm.Name) != "/sys/fs/cgroup" || !vm.ReadOnly {
			t.Error("agent /sys/fs/cgroup: want the host's /sys/fs/cgroup, read-only")
		}
	}
	// Node-following: this node's name, the ConfigMap's conflist as the
	// template, the node's conf dir writable.
	arg := func(name, def string) string {
		for i, a := range agent.Args {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
			if a == name && i+1 < len(agent.Args) {
				return agent.Args[i+1]
			}
		}
		return def
	}
	pin := arg("--pin-dir", defaultPin)
	nodeName := false
	for _, e := range agent.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Error("agent: NODE_NAME from spec.nodeName missing (Node-following)")
	}
	if tmpl := arg("--cni-conf-template", ""); tmpl != filepath.Join("/etc/ebpf-cni", conflistKey) {
		t.Errorf("agent --cni-conf-template %q, want /etc/ebpf-cni/%s (the ConfigMap)", tmpl, conflistKey)
	}
	// The cleanup mode (docs/uninstall.md): a ConfigMap key, absent as
	// shipped, so no stop of an agent (an upgrade, a restart) uninstalls.
	if f := arg("--uninstall-on-stop", ""); f != "/etc/ebpf-cni/uninstall-on-stop" {
		t.Errorf("agent --uninstall-on-stop %q, want /etc/ebpf-cni/uninstall-on-stop (the ConfigMap's key)", f)
	}
	if v, ok := m.configMap.Data["uninstall-on-stop"]; ok {
		t.Errorf("ConfigMap sets uninstall-on-stop to %q as shipped: every agent stop would uninstall", v)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("terminationGracePeriodSeconds %v: an uninstall on stop needs time to tear pods down (want >= 30)", g)
	}
	if vm := mountOf(agent, "/etc/ebpf-cni"); vm != nil {
		if v := vols[vm.Name]; v.ConfigMap == nil || v.ConfigMap.Name != m.configMap.Name {
			t.Errorf("agent /etc/ebpf-cni: want the ConfigMap %s", m.configMap.Name)
		}
	}
	if vm := mountOf(agent, "/etc/cni/net.d"); vm != nil && vm.ReadOnly {
		t.Error("agent /etc/cni/net.d: read-only, but the agent writes the conflist there")
	}

	// The conflist: what containerd 1.6 accepts, the plugin first, same pins as the agent.
	raw, ok := m.configMap.Data[conflistKey]
	if !ok {
		t.Fatalf("ConfigMap %s: no key %s", m.configMap.Name, conflistKey)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []struct {
			Type         string          `json:"type"`
			PinDir       string          `json:"pinDir"`
			Capabilities map[string]bool `json:"capabilities"`
			IPAM         json.RawMessage `json:"ipam"`
		} `json:"plugins"`
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	if err := dec.Decode(&conf); err != nil {
		t.Fatalf("conflist: %v", err)
	}
	if !slices.Contains([]string{"0.3.0", "0.3.1", "0.4.0", "1.0.0"}, conf.CNIVersion) {
		t.Errorf("conflist cniVersion %q: containerd 1.6 needs 1.0.0 or lower", conf.CNIVersion)
	}
	if conf.Name == "" || len(conf.Plugins) == 0 || conf.Plugins[0].Type != "ebpf-cni" {
		t.Fatalf("conflist: want a name and ebpf-cni as the first plugin: %s", raw)
	}
	p := conf.Plugins[0]
	if p.PinDir != "" && p.PinDir != pin {
		t.Errorf("conflist pinDir %s differs from the agent's --pin-dir %s", p.PinDir, pin)
	}
	for c := range p.Capabilities {
		if c != "portMappings" && c != "bandwidth" {
			t.Errorf("conflist capability %q: the plugin knows portMappings and bandwidth", c)
		}
	}
	if len(p.IPAM) == 0 {
		t.Error("conflist: ipam missing")
	}
	if *conflistOut != "" {
		if err := os.WriteFile(*conflistOut, []byte(raw), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// RBAC: list and watch nodes, pods, namespaces (core) and
	// networkpolicies (networking.k8s.io), the agent's informers, bound to
	// this service account, nothing more.
	want := map[string][]string{"": {"namespaces", "nodes", "pods"}, "networking.k8s.io": {"networkpolicies"}}
	got := map[string][]string{}
	for _, r := range m.role.Rules {
		if !slices.Equal(r.Verbs, []string{"list", "watch"}) || len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("ClusterRole rule %+v: want list and watch only", r)
		}
		for _, g := range r.APIGroups {
			got[g] = append(got[g], r.Resources...)
		}
	}
	for g := range got {
		slices.Sort(got[g])
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ClusterRole resources %v: want exactly %v", got, want)
	}
	// The agent programs NetworkPolicy; the conflist keeps new pods closed until it has.
	if !slices.Contains(agent.Args, "--network-policy") {
		t.Error("agent: --network-policy missing (the conflist's networkPolicy needs the agent to open pods)")
	}
	var np struct {
		Plugins []struct {
			NetworkPolicy bool `json:"networkPolicy"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(raw), &np); err != nil || len(np.Plugins) == 0 || !np.Plugins[0].NetworkPolicy {
		t.Error("conflist: networkPolicy: true missing (the agent runs --network-policy)")
	}
	if m.binding.RoleRef.Name != m.role.Name || len(m.binding.Subjects) != 1 ||
		m.binding.Subjects[0].Name != m.sa.Name || m.binding.Subjects[0].Namespace != namespace {
		t.Errorf("ClusterRoleBinding: want %s bound to %s/%s", m.role.Name, namespace, m.sa.Name)
	}
}

// TestDockerfileMatchesManifest: the paths the manifest execs are the ones
// deploy/Dockerfile fills, and the installer's default source is where the
// Dockerfile puts the CNI binaries.
func TestDockerfileMatchesManifest(t *testing.T) {
	df, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	copies := map[string][]string{} // destination dir -> files
	for _, l := range strings.Split(string(df), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "COPY" {
			continue
		}
		var srcs []string
		for _, s := range f[1 : len(f)-1] {
			if !strings.HasPrefix(s, "--") {
				srcs = append(srcs, filepath.Base(s))
			}
		}
		dst := strings.TrimSuffix(f[len(f)-1], "/")
		copies[dst] = append(copies[dst], srcs...)
	}
	for dir, files := range map[string][]string{
		filepath.Dir(agentPath): {"ebpf-agent", "install-cni"},
		cniBinSrc:               {"ebpf-cni", "host-local", "loopback"},
	} {
		for _, f := range files {
			if !slices.Contains(copies[dir], f) {
				t.Errorf("Dockerfile: no COPY of %s into %s/ (copies: %v)", f, dir, copies)
			}
		}
	}
	inst, err := os.ReadFile(filepath.Join(deployDir, "install-cni", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(inst, []byte(`"bin-src", "`+cniBinSrc+`"`)) {
		t.Errorf("install-cni's default -bin-src is not %s", cniBinSrc)
	}
}
