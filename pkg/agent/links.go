package agent

import (
	"context"
	"log"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
	"github.com/ebpf-cni/ebpf-cni/pkg/state"
)

// linkWatcher is the agent's one subscription to link events, fanned out
// to the controllers that want them (reconcile, background work, node
// hooks, policy). Handlers run on the watcher's goroutine and must not
// block: they note the event and wake their own loop.
type linkWatcher struct {
	lg      *log.Logger
	updates chan netlink.LinkUpdate
	subs    []linkHandler
}

// linkHandler is one subscriber: update sees every event; lost is called
// when events may have been missed (the kernel's socket buffer overflowed,
// or no subscription could be made), so the subscriber looks at
// everything again.
type linkHandler struct {
	update func(netlink.LinkUpdate)
	lost   func()
}

// newLinkWatcher subscribes before it returns, so no link change after the
// agent reports ready goes unseen; events wait in the channel until Run.
func newLinkWatcher(ctx context.Context, lg *log.Logger) *linkWatcher {
	w := &linkWatcher{lg: lg}
	if err := w.subscribe(ctx); err != nil {
		lg.Printf("no link events (%v); the controllers rely on their timers until a subscription succeeds", err)
	}
	return w
}

// handle registers a handler; only before Run.
func (w *linkWatcher) handle(h linkHandler) { w.subs = append(w.subs, h) }

func (w *linkWatcher) subscribe(ctx context.Context) error {
	ch := make(chan netlink.LinkUpdate, 1024)
	err := netlink.LinkSubscribeWithOptions(ch, ctx.Done(), netlink.LinkSubscribeOptions{
		// A receive error (ENOBUFS: events were lost) ends netlink's
		// reader, which closes ch: Run notices and subscribes again.
		ErrorCallback: func(error) {},
	})
	if err != nil {
		w.updates = nil
		return err
	}
	w.updates = ch
	return nil
}

// Run fans events out until ctx ends. When the subscription ends (events
// lost) or never started, a new one is made (tried every 100 ms), and only
// then is every subscriber told events were lost: the full look it takes
// then misses nothing the new subscription does not show.
func (w *linkWatcher) Run(ctx context.Context) error {
	for {
		if w.updates != nil {
			for u := range w.updates {
				for _, h := range w.subs {
					h.update(u)
				}
			}
		}
		said := false
		for {
			select { // never a busy loop, whatever ends subscriptions
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			err := w.subscribe(ctx)
			if err == nil {
				break
			}
			if !said {
				w.lg.Printf("link events: %v (retrying; the controllers rely on their timers meanwhile)", err)
				said = true
			}
		}
		for _, h := range w.subs {
			if h.lost != nil {
				h.lost()
			}
		}
	}
}

// ourHostVeth tells whether the link of event u is (or, for RTM_DELLINK,
// was) one of our host veths: named ebpf…, or a veth whose ifindex has a
// cni_links entry (only our verbs write one), whatever an operator renamed
// it to. A DEL removes the entry only after its veth is gone, so the
// deletion of a veth that is still ours is seen as ours.
func ourHostVeth(m *maps.Maps, u netlink.LinkUpdate) bool {
	if u.Link == nil {
		return false
	}
	a := u.Link.Attrs()
	if strings.HasPrefix(a.Name, state.HostIfPrefix) {
		return true
	}
	if m == nil || u.Link.Type() != "veth" {
		return false
	}
	_, err := m.Links().Lookup(a.Index)
	return err == nil
}
