// Package netpol is the agent's NetworkPolicy controller: it lists and
// watches pods, namespaces and NetworkPolicies (client-go informers into a
// compile.Snapshot), and programs each local pod interface with its
// compiled policy through a policy.Writer, keyed by the host veth's
// ifindex. The plugin leaves a new interface pending (closed) until then;
// this controller opens nothing before its first complete list, writes
// only what changed, and reacts to new attachment records and host veths
// at once rather than at the next resync.
package netpol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ebpf-cni/ebpf-cni/pkg/kubewatch"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy"
	"github.com/ebpf-cni/ebpf-cni/pkg/policy/compile"
	"github.com/ebpf-cni/ebpf-cni/pkg/safedir"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// Config is what the controller needs.
type Config struct {
	Kube      *rest.Config
	StateDir  string // the plugin's attachment records
	StatusDir string // what was programmed per interface, for `ebpf-agent dump policy`
	// NodeName is this node's: a record of it does not add its
	// addresses to a pod whose object names another node (podAddrs).
	NodeName string
	Writer   policy.Writer
	Logf     func(string, ...any)
	// Resync re-reads every record and re-checks every interface (a
	// backstop for missed events); 0: a minute.
	Resync time.Duration

	// Sweep deletes rule sets nothing refers to (DEL forgets only an
	// interface's state); called at every resync. nil: none.
	Sweep func() (int, error)

	// Tests' seams: the source of a resource's list/watch (nil: the API
	// server of Kube), and the name of the link with an ifindex (nil:
	// netlink).
	ListWatch func(resource string) (cache.ListerWatcher, error)
	LinkName  func(ifindex int) (string, bool)

	// WatchIdle ends a watch on which nothing (no event, no bookmark)
	// arrived for this long, or whose request got no answer: the
	// informer then watches again (kubewatch). 0: kubewatch.DefaultIdle.
	WatchIdle time.Duration
}

// Controller programs the local pod interfaces' NetworkPolicy.
type Controller struct {
	cfg   Config
	snap  *compile.Snapshot
	addrs *podAddrs
	kick  chan struct{}

	mu      sync.Mutex
	since   time.Time // when the oldest change not yet programmed arrived
	synced  bool
	reread  bool // records or links changed since the last pass
	records []*state.Record

	// Only Run's goroutine touches these.
	applied map[uint32]applied
	said    map[string]string
	lat     *latencies
}

// applied is what the writer was last given for an interface (and when:
// not compared).
type applied struct {
	hostIf, pod, container string
	ep                     policy.Endpoint
	at                     time.Time
}

// New readies a controller; Run starts it.
func New(cfg Config) *Controller {
	if cfg.Resync == 0 {
		cfg.Resync = time.Minute
	}
	if cfg.ListWatch == nil {
		cfg.ListWatch = func(resource string) (cache.ListerWatcher, error) { return apiListWatch(cfg.Kube, resource) }
	}
	if cfg.WatchIdle == 0 {
		cfg.WatchIdle = kubewatch.DefaultIdle
	}
	if cfg.LinkName == nil {
		cfg.LinkName = func(idx int) (string, bool) {
			l, err := netlink.LinkByIndex(idx)
			if err != nil {
				return "", false
			}
			return l.Attrs().Name, true
		}
	}
	snap := compile.New()
	return &Controller{cfg: cfg, snap: snap, addrs: newPodAddrs(snap, cfg.NodeName), kick: make(chan struct{}, 1),
		applied: map[uint32]applied{}, said: map[string]string{}, lat: newLatencies(1024)}
}

// changed notes a change that arrived at `at` and wakes the loop.
func (c *Controller) changed(at time.Time) {
	c.mu.Lock()
	if c.since.IsZero() || at.Before(c.since) {
		c.since = at
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// attachmentsChanged: records or host veths changed; the next pass reads
// the records again (an API change alone reuses them).
func (c *Controller) attachmentsChanged() {
	c.mu.Lock()
	c.reread = true
	c.mu.Unlock()
	c.changed(time.Now())
}

// LinkEvent is the agent's link watcher's handler: a host veth that
// appears or goes may be an attachment to program or forget.
func (c *Controller) LinkEvent(u netlink.LinkUpdate) {
	if strings.HasPrefix(u.Attrs().Name, state.HostIfPrefix) {
		c.attachmentsChanged()
	}
}

// LinksLost: link events were missed; look at everything.
func (c *Controller) LinksLost() { c.attachmentsChanged() }

// Run returns when ctx ends, or with an error when the informers cannot
// be set up.
func (c *Controller) Run(ctx context.Context) error {
	if c.cfg.Writer == nil {
		return errors.New("this build's datapath cannot enforce NetworkPolicy")
	}
	f := &feed{snap: c.snap, addrs: c.addrs, changed: c.changed, logf: c.cfg.Logf}
	start := time.Now()
	lw := func(resource string) (cache.ListerWatcher, error) {
		inner, err := c.cfg.ListWatch(resource)
		if err != nil {
			return nil, err
		}
		return kubewatch.Bounded(inner, c.cfg.WatchIdle, func(what string, d time.Duration) {
			c.cfg.Logf("policy: watch %s: no %s in %s; watching again", resource, what, d)
		}), nil
	}
	synced, err := startInformers(ctx, lw, f)
	if err != nil {
		return err
	}
	go func() {
		if err := watchRecords(ctx, c.cfg.StateDir, c.attachmentsChanged); err != nil {
			c.cfg.Logf("policy: no record notifications (%v): new pods wait for their host veth's link event or the resync", err)
		}
	}()
	if err := safedir.MkdirAll(c.cfg.StatusDir); err != nil {
		c.cfg.Logf("policy: %v (no status for dump policy)", err)
	}
	c.cfg.Logf("policy: listing pods, namespaces and NetworkPolicies; until then what is programmed stays, new interfaces stay closed")
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	c.mu.Lock()
	c.synced = true
	c.since = time.Time{} // the first pass is no change's latency
	c.mu.Unlock()
	c.cfg.Logf("policy: listed in %s", time.Since(start).Round(time.Millisecond))
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		if err := c.sync(); err != nil {
			// Said once per distinct error: a full map fails every retry.
			c.once("sync", "policy: %v (retrying every second)", err)
			retry.Reset(time.Second)
		} else {
			delete(c.said, "sync")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-retry.C:
			c.attachmentsChanged()
		case <-tick.C:
			c.attachmentsChanged()
			if c.cfg.Sweep != nil {
				if n, err := c.cfg.Sweep(); err != nil {
					c.cfg.Logf("policy: sweep: %v", err)
				} else if n > 0 {
					c.cfg.Logf("policy: swept %d rule sets of interfaces gone", n)
				}
			}
		}
	}
}

// sync programs every local attachment whose compiled policy differs from
// what it was last given, and forgets those whose host veth is gone.
func (c *Controller) sync() error {
	c.mu.Lock()
	since, reread := c.since, c.reread || c.records == nil
	c.since, c.reread = time.Time{}, false
	c.mu.Unlock()

	recs := c.records
	if reread {
		var err error
		if recs, err = readRecords(c.cfg.StateDir); err != nil {
			c.mu.Lock()
			c.reread = true
			c.mu.Unlock()
			return err
		}
		c.records = recs
		// Before the compile: the records decide the node's pods'
		// addresses (podAddrs), and may take some from other pods.
		c.addrs.setRecords(recs)
	}
	// Only the pods a change may have affected need a look, unless the
	// attachments changed (taking them also keeps the set from growing).
	var dirty map[string]bool
	if ks := c.snap.TakeDirty(); !reread {
		dirty = make(map[string]bool, len(ks))
		for _, k := range ks {
			dirty[k.String()] = true
		}
	}
	seen, wrote, errs := c.applyRecords(recs, dirty)
	forgot, err := c.forgetGone(seen)
	c.report(since, wrote, forgot)
	return errors.Join(errs, err)
}

// readRecords lists the node's attachment records, the oldest ADD first:
// interfaces are written in that order, so a new pod on an address freed
// by another is opened after the interfaces that lose that address as a
// peer are written, not before.
func readRecords(dir string) ([]*state.Record, error) {
	recs, err := state.ListAll(dir)
	if err != nil {
		return nil, fmt.Errorf("attachment records: %w", err)
	}
	if recs == nil {
		recs = []*state.Record{}
	}
	slices.SortStableFunc(recs, func(x, y *state.Record) int { return x.Created.Compare(y.Created) })
	return recs, nil
}

// applyRecords programs the policy interfaces of recs that dirty (nil:
// all) may have changed and whose rules differ from the applied ones; seen
// are the interfaces the records still hold.
func (c *Controller) applyRecords(recs []*state.Record, dirty map[string]bool) (seen map[uint32]bool, wrote int, errs error) {
	seen = map[uint32]bool{}
	for _, r := range recs {
		if r.Provisional || r.HostIfindex <= 0 || !r.Policy {
			// Its ADD has not finished (the interface is pending until
			// then and after), or its network has no networkPolicy.
			continue
		}
		idx := uint32(r.HostIfindex)
		if _, known := c.applied[idx]; known && dirty != nil && !dirty[r.PodLabel()] {
			seen[idx] = true
			continue // nothing that changed reaches its policy
		}
		if name, ok := c.cfg.LinkName(r.HostIfindex); !ok || name != r.HostIf {
			continue // a record of a veth gone (reconcile's) or not ours
		}
		ep, ok := c.endpoint(r)
		if !ok {
			continue
		}
		seen[idx] = true
		want := applied{hostIf: r.HostIf, pod: r.PodLabel(), container: r.ContainerID, ep: ep}
		if have, ok := c.applied[idx]; ok {
			have.at = time.Time{}
			if reflect.DeepEqual(have, want) {
				continue
			}
		}
		if err := c.cfg.Writer.Apply(idx, ep); err != nil {
			errs = errors.Join(errs, fmt.Errorf("program %s (%s): %w", r.HostIf, dashed(r.PodLabel()), err))
			delete(c.applied, idx)
			continue
		}
		want.at = time.Now()
		c.applied[idx] = want
		wrote++
	}
	return seen, wrote, errs
}

// forgetGone forgets the applied interfaces the records no longer hold.
func (c *Controller) forgetGone(seen map[uint32]bool) (forgot int, errs error) {
	for idx := range c.applied {
		if seen[idx] {
			continue
		}
		// Gone from the records. Its DEL removed the entry; a veth that is
		// still there is left alone (a DEL in progress, or a new pod's ADD
		// that took the ifindex owns it now).
		if _, ok := c.cfg.LinkName(int(idx)); !ok {
			if err := c.cfg.Writer.Remove(idx); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = errors.Join(errs, fmt.Errorf("forget ifindex %d: %w", idx, err))
				continue
			}
		}
		delete(c.applied, idx)
		forgot++
	}
	return forgot, errs
}

// report logs the latency of a change that wrote interfaces and writes the
// status file dumps read, once a pass changed anything.
func (c *Controller) report(since time.Time, wrote, forgot int) {
	if wrote > 0 && !since.IsZero() {
		d := time.Since(since)
		c.lat.add(d)
		p50, p99, n := c.lat.quantiles()
		c.cfg.Logf("policy: programmed %d interfaces %s after the change (last %d changes: p50 %s, p99 %s)",
			wrote, d.Round(10*time.Microsecond), n, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
	}
	if wrote > 0 || forgot > 0 {
		// For dumps only: after every interface is programmed.
		sts := make([]Status, 0, len(c.applied))
		for idx, a := range c.applied {
			sts = append(sts, Status{Ifindex: idx, HostIf: a.hostIf, Pod: a.pod, ContainerID: a.container, Endpoint: a.ep, Applied: a.at})
		}
		if err := writeStatus(c.cfg.StatusDir, sts); err != nil {
			c.once("status", "policy: status for dump: %v", err)
		}
	}
}

// endpoint is the compiled policy of a record's pod. An attachment of no
// pod (no K8S_POD_NAME) is selected by no policy: open. A pod the informer
// does not know yet stays as it is (closed when new) until it does.
func (c *Controller) endpoint(r *state.Record) (policy.Endpoint, bool) {
	if r.PodName == "" {
		return policy.Endpoint{}, true
	}
	ep, ok := c.snap.Endpoint(r.PodNamespace, r.PodName)
	if !ok {
		c.once("unknown/"+r.PodLabel(), "policy: pod %s (%s) is not in the API server's list yet: its interface stays as it is", r.PodLabel(), r.HostIf)
		return ep, false
	}
	delete(c.said, "unknown/"+r.PodLabel())
	return ep, true
}

// once logs msg under key unless the last message under key was the same.
func (c *Controller) once(key, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if c.said[key] != msg {
		c.said[key] = msg
		c.cfg.Logf("%s", msg)
	}
}

func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// latencies keeps the last n change-to-programmed durations.
type latencies struct {
	mu   sync.Mutex
	ring []time.Duration
	next int
	full bool
}

func newLatencies(n int) *latencies { return &latencies{ring: make([]time.Duration, n)} }

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = d
	l.next = (l.next + 1) % len(l.ring)
	if l.next == 0 {
		l.full = true
	}
}

func (l *latencies) quantiles() (p50, p99 time.Duration, n int) {
	l.mu.Lock()
	n = l.next
	if l.full {
		n = len(l.ring)
	}
	s := slices.Clone(l.ring[:n])
	l.mu.Unlock()
	if n == 0 {
		return 0, 0, 0
	}
	slices.Sort(s)
	return s[(n-1)*50/100], s[(n-1)*99/100], n
}
