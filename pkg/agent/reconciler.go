package agent

import (
	"context"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// reconciler removes the state of pods gone without DEL (ReconcileAll):
// at start, every Options.ReconcileInterval, and shortly after a host veth
// disappears, under any name (the usual sign of such a pod).
type reconciler struct {
	o       Options
	col     *collector
	deleted chan struct{}
}

func newReconciler(o Options, m *maps.Maps, col *collector, w *linkWatcher) *reconciler {
	r := &reconciler{o: o, col: col, deleted: make(chan struct{}, 1)}
	w.handle(linkHandler{update: func(u netlink.LinkUpdate) {
		if u.Header.Type == syscall.RTM_DELLINK && ourHostVeth(m, u) {
			r.kick()
		}
	}, lost: r.kick})
	return r
}

func (r *reconciler) kick() {
	select {
	case r.deleted <- struct{}{}:
	default:
	}
}

func (r *reconciler) reconcile(why string) {
	removed, err := ReconcileAll(r.o, false)
	r.col.addRemoved(removed)
	if len(removed) > 0 || err != nil {
		counts := map[string]int{}
		for _, s := range removed {
			counts[s.Kind]++
		}
		r.o.Logger.Printf("reconcile (%s): removed %v; errors: %v", why, counts, err)
	}
}

// Run returns when ctx ends.
func (r *reconciler) Run(ctx context.Context) error {
	r.reconcile("start")
	tick := time.NewTicker(r.o.ReconcileInterval)
	defer tick.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.deleted:
			if debounce == nil {
				debounce = time.After(2 * time.Second) // let a DEL in flight finish first
			}
		case <-debounce:
			debounce = nil
			r.reconcile("link deleted")
		case <-tick.C:
			r.reconcile("timer")
		}
	}
}
