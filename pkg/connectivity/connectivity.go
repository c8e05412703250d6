// Package connectivity is `ebpf-agent connectivity`: it deploys a few pods
// into a namespace of its own and checks each path a CNI must carry (pod to
// pod on one node and across nodes, TCP and UDP, a ClusterIP Service, DNS,
// hostPort, NodePort, egress out of the cluster, NetworkPolicy allow and
// deny), then prints one row per path and removes what it made. Every probe
// is a pod running `agnhost connect` (the e2e suite's own probe): its exit
// status is the verdict, so the check needs no exec into pods.
package connectivity

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/ebpf-cni/ebpf-cni/pkg/agent/inspect"
)

// Options of one run.
type Options struct {
	Config    *rest.Config
	Namespace string        // made by the run, deleted at its end (unless Keep)
	Image     string        // an agnhost image the nodes have or can pull
	HostPort  int32         // the servers' hostPort
	External  string        // host:port outside the cluster; "": the API server's endpoint
	Policy    bool          // also check NetworkPolicy deny and allow
	Timeout   time.Duration // one probe's connect timeout
	Keep      bool
	Logf      func(string, ...any)
}

// Result is one path's verdict.
type Result struct {
	Check  string        `json:"check"`
	From   string        `json:"from"` // the probe's node
	Target string        `json:"target"`
	Want   string        `json:"want"` // "connect" or "blocked"
	Got    string        `json:"got"`  // "connect", or agnhost's error (TIMEOUT, REFUSED, DNS, ...)
	OK     bool          `json:"ok"`
	Took   time.Duration `json:"took"`
}

const (
	appLabel   = "app.kubernetes.io/name"
	appValue   = "ebpf-cni-connectivity"
	httpPort   = 8080
	udpPort    = 8081
	svcName    = "echo"
	svcNPName  = "echo-nodeport"
	podTimeout = 3 * time.Minute
)

type node struct {
	name string
	ip   string
}

type run struct {
	o     Options
	c     *client
	nodes []node
	srv   []string // server pod IPs, one per node
	svcIP string
	np    int32
	seq   int
	mu    sync.Mutex
}

// Run makes the pods, probes every path and returns one result per path.
// An error means the check could not be made (no node, a server that never
// became ready); failed paths are results, not errors.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	c, err := newClient(o.Config)
	if err != nil {
		return nil, err
	}
	r := &run{o: o, c: c}
	if err := r.findNodes(ctx); err != nil {
		return nil, err
	}
	if err := r.setUp(ctx); err != nil {
		r.tearDown()
		return nil, err
	}
	defer r.tearDown()
	res := r.probe(ctx, r.paths(ctx))
	if o.Policy {
		pr, err := r.policy(ctx)
		if err != nil {
			return res, err
		}
		res = append(res, pr...)
	}
	return res, nil
}

func (r *run) findNodes(ctx context.Context) error {
	var nl corev1.NodeList
	if err := r.c.list(ctx, "", "nodes", &nl); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nl.Items {
		if n.Spec.Unschedulable || n.Labels["kubernetes.io/os"] != "linux" || !ready(n) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				r.nodes = append(r.nodes, node{name: n.Name, ip: a.Address})
				break
			}
		}
	}
	if len(r.nodes) == 0 {
		return errors.New("no Ready, schedulable Linux node with an InternalIP")
	}
	sort.Slice(r.nodes, func(i, j int) bool { return r.nodes[i].name < r.nodes[j].name })
	if len(r.nodes) > 2 {
		r.nodes = r.nodes[:2]
	}
	if len(r.nodes) == 1 {
		r.o.Logf("one node only: the paths across nodes are not checked")
	}
	return nil
}

func ready(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (r *run) setUp(ctx context.Context) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.o.Namespace, Labels: map[string]string{appLabel: appValue}}}
	if err := r.c.create(ctx, "", "namespaces", ns, &corev1.Namespace{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s exists (a run still going, or one killed): delete it, or give --namespace", r.o.Namespace)
		}
		return err
	}
	r.o.Logf("namespace %s: servers on %d node(s)", r.o.Namespace, len(r.nodes))
	for i, n := range r.nodes {
		if err := r.c.create(ctx, r.o.Namespace, "pods", r.server(i, n), &corev1.Pod{}); err != nil {
			return err
		}
	}
	sel := map[string]string{appLabel: appValue, "role": "server"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName},
		Spec: corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(httpPort), Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(udpPort), Protocol: corev1.ProtocolUDP},
		}},
	}
	var out corev1.Service
	if err := r.c.create(ctx, r.o.Namespace, "services", svc, &out); err != nil {
		return err
	}
	r.svcIP = out.Spec.ClusterIP
	np := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcNPName},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: sel, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(httpPort), Protocol: corev1.ProtocolTCP},
		}},
	}
	if err := r.c.create(ctx, r.o.Namespace, "services", np, &out); err != nil {
		return err
	}
	r.np = out.Spec.Ports[0].NodePort
	r.srv = make([]string, len(r.nodes))
	deadline := time.Now().Add(podTimeout)
	for i := range r.nodes {
		for {
			var p corev1.Pod
			if err := r.c.get(ctx, r.o.Namespace, "pods", serverName(i), &p); err != nil {
				return fmt.Errorf("server %s: %w", serverName(i), err)
			}
			if p.Status.PodIP != "" && podReady(p) {
				r.srv[i] = p.Status.PodIP
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("server pod %s on %s not ready after %s (phase %s)", serverName(i), r.nodes[i].name, podTimeout, p.Status.Phase)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func serverName(i int) string { return "server-" + strconv.Itoa(i) }

func (r *run) server(i int, n node) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: serverName(i), Labels: map[string]string{appLabel: appValue, "role": "server", "server": strconv.Itoa(i)}},
		Spec: corev1.PodSpec{
			NodeName:                      n.name,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "netexec", Image: r.o.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"netexec", "--http-port=" + strconv.Itoa(httpPort), "--udp-port=" + strconv.Itoa(udpPort)},
				Ports: []corev1.ContainerPort{
					{Name: "http", ContainerPort: httpPort, HostPort: r.o.HostPort, Protocol: corev1.ProtocolTCP},
					{Name: "udp", ContainerPort: udpPort, Protocol: corev1.ProtocolUDP},
				},
				// The kubelet's probe: node-to-pod traffic, which NetworkPolicy must let through.
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(httpPort)}}, PeriodSeconds: 2},
			}},
		},
	}
}

type path struct {
	check, proto, target, want string
	from                       int               // node index of the probe
	labels                     map[string]string // extra labels of the probe pod
}

func (r *run) paths(ctx context.Context) []path {
	hp := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	ps := []path{
		{check: "pod to pod, same node", proto: "tcp", target: hp(r.srv[0], httpPort)},
		{check: "pod to pod, same node", proto: "udp", target: hp(r.srv[0], udpPort)},
		{check: "Service (ClusterIP)", proto: "tcp", target: hp(r.svcIP, 80)},
		{check: "Service (ClusterIP)", proto: "udp", target: hp(r.svcIP, 81)},
		{check: "DNS + Service", proto: "tcp", target: net.JoinHostPort(svcName+"."+r.o.Namespace+".svc.cluster.local", "80")},
		{check: "hostPort, same node", proto: "tcp", target: hp(r.nodes[0].ip, int(r.o.HostPort))},
		{check: "NodePort, same node", proto: "tcp", target: hp(r.nodes[0].ip, int(r.np))},
	}
	if len(r.nodes) > 1 {
		ps = append(ps,
			path{check: "pod to pod, other node", proto: "tcp", target: hp(r.srv[1], httpPort)},
			path{check: "pod to pod, other node", proto: "udp", target: hp(r.srv[1], udpPort)},
			path{check: "hostPort, other node", proto: "tcp", target: hp(r.nodes[1].ip, int(r.o.HostPort))},
			path{check: "NodePort, other node", proto: "tcp", target: hp(r.nodes[1].ip, int(r.np))},
		)
	}
	ext := r.o.External
	if ext == "" {
		ext = r.apiEndpoint(ctx)
	}
	if ext != "" {
		ps = append(ps, path{check: "egress out of the cluster", proto: "tcp", target: ext})
	}
	for i := range ps {
		ps[i].want = "connect"
	}
	return ps
}

// apiEndpoint is the API server's own address (the default/kubernetes
// Endpoints): outside the pod network on every cluster, reachable from pods
// by design, so a connection to it is egress out of the cluster.
func (r *run) apiEndpoint(ctx context.Context) string {
	var ep corev1.Endpoints
	if err := r.c.get(ctx, "default", "endpoints", "kubernetes", &ep); err != nil || len(ep.Subsets) == 0 ||
		len(ep.Subsets[0].Addresses) == 0 || len(ep.Subsets[0].Ports) == 0 {
		r.o.Logf("no default/kubernetes endpoint: egress not checked (give --external)")
		return ""
	}
	s := ep.Subsets[0]
	return net.JoinHostPort(s.Addresses[0].IP, strconv.Itoa(int(s.Ports[0].Port)))
}

// probe runs every path at once, one probe pod each.
func (r *run) probe(ctx context.Context, ps []path) []Result {
	res := make([]Result, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = r.one(ctx, p)
		}()
	}
	wg.Wait()
	return res
}

func (r *run) one(ctx context.Context, p path) Result {
	start := time.Now()
	got := r.connect(ctx, p)
	from := r.nodes[p.from].name
	return Result{Check: p.check + " (" + p.proto + ")", From: from, Target: p.target, Want: p.want, Got: got,
		OK: got == p.want || (p.want == "blocked" && refused(got)), Took: time.Since(start).Round(time.Millisecond)}
}

// refused is a verdict of the network: the probe ran and could not connect
// (not a probe that could not be made).
func refused(got string) bool {
	return got == "TIMEOUT" || got == "REFUSED" || strings.HasPrefix(got, "OTHER")
}

// connect runs one probe pod to its end: "connect", or what agnhost said.
func (r *run) connect(ctx context.Context, p path) string {
	r.mu.Lock()
	r.seq++
	name := fmt.Sprintf("probe-%d", r.seq)
	r.mu.Unlock()
	labels := map[string]string{appLabel: appValue, "role": "probe"}
	for k, v := range p.labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName: r.nodes[p.from].name, RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "connect", Image: r.o.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args:                     []string{"connect", "--timeout=" + r.o.Timeout.String(), "--protocol=" + p.proto, p.target},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	if err := r.c.create(ctx, r.o.Namespace, "pods", pod, &corev1.Pod{}); err != nil {
		return "probe not made: " + err.Error()
	}
	defer r.c.delete(context.Background(), r.o.Namespace, "pods", name) //nolint:errcheck // the namespace goes too
	deadline := time.Now().Add(podTimeout)
	for time.Now().Before(deadline) {
		var got corev1.Pod
		if err := r.c.get(ctx, r.o.Namespace, "pods", name, &got); err == nil {
			switch got.Status.Phase {
			case corev1.PodSucceeded:
				return "connect"
			case corev1.PodFailed:
				for _, cs := range got.Status.ContainerStatuses {
					if t := cs.State.Terminated; t != nil && strings.TrimSpace(t.Message) != "" {
						return strings.Fields(strings.TrimSpace(t.Message))[0]
					}
				}
				return "failed"
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err().Error()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return "probe pod did not finish in " + podTimeout.String()
}

// policy isolates server-0 (deny all ingress), then allows probes labelled
// access=true: a probe without the label must stay blocked, one with it
// must connect, and the kubelet's readiness probe keeps the server Ready.
func (r *run) policy(ctx context.Context) ([]Result, error) {
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-server-0"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"server": "0"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if err := r.c.create(ctx, r.o.Namespace, "networkpolicies", deny, &networkingv1.NetworkPolicy{}); err != nil {
		return nil, err
	}
	target := net.JoinHostPort(r.srv[0], strconv.Itoa(httpPort))
	from := len(r.nodes) - 1
	blocked := path{check: "NetworkPolicy deny", proto: "tcp", target: target, want: "blocked", from: from}
	res := []Result{r.settle(ctx, blocked)}

	allow := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "allow-access-server-0"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"server": "0"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"access": "true"}},
			}}}},
		},
	}
	if err := r.c.create(ctx, r.o.Namespace, "networkpolicies", allow, &networkingv1.NetworkPolicy{}); err != nil {
		return res, err
	}
	allowed := path{check: "NetworkPolicy allow", proto: "tcp", target: target, want: "connect", from: from, labels: map[string]string{"access": "true"}}
	blocked.check = "NetworkPolicy allow, other pods still denied"
	res = append(res, r.settle(ctx, allowed), r.settle(ctx, blocked))
	var p corev1.Pod
	if err := r.c.get(ctx, r.o.Namespace, "pods", serverName(0), &p); err == nil {
		res = append(res, Result{Check: "isolated pod's kubelet probe (node to pod)", From: r.nodes[0].name, Target: serverName(0),
			Want: "Ready", Got: map[bool]string{true: "Ready", false: "not Ready"}[podReady(p)], OK: podReady(p)})
	}
	return res, nil
}

// settle probes again (a few times) until the verdict is the wanted one: a
// policy reaches the nodes some time after the API server has it.
func (r *run) settle(ctx context.Context, p path) Result {
	var res Result
	for try := 0; try < 5; try++ {
		if res = r.one(ctx, p); res.OK {
			return res
		}
	}
	return res
}

func (r *run) tearDown() {
	if r.o.Keep {
		r.o.Logf("kept namespace %s", r.o.Namespace)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.c.delete(ctx, "", "namespaces", r.o.Namespace); err != nil && !apierrors.IsNotFound(err) {
		r.o.Logf("delete namespace %s: %v", r.o.Namespace, err)
	}
}

// Report is a run's results, for inspect.Write (table, or -o json).
type Report struct {
	Results []Result `json:"results"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
}

// NewReport counts the results.
func NewReport(rs []Result) Report {
	r := Report{Results: rs}
	for _, x := range rs {
		if x.OK {
			r.Passed++
		} else {
			r.Failed++
		}
	}
	return r
}

// Tables is the table form: one row per path, then the count.
func (r Report) Tables() []inspect.Table {
	t := inspect.Table{Header: []string{"CHECK", "FROM", "TARGET", "WANT", "GOT", "RESULT", "TOOK"},
		Footer: fmt.Sprintf("%d passed, %d failed", r.Passed, r.Failed)}
	for _, x := range r.Results {
		t.Rows = append(t.Rows, []string{x.Check, x.From, x.Target, x.Want, x.Got, map[bool]string{true: "ok", false: "FAIL"}[x.OK], x.Took.String()})
	}
	return []inspect.Table{t}
}
