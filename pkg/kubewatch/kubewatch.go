// Package kubewatch bounds how long an informer's watch may stay silent.
//
// client-go's reflector waits on a watch until the API server ends it
// (timeoutSeconds, 5 to 10 minutes) and, before that, until the server
// answers the request at all, with no client-side limit. HTTP/2's ping
// (ReadIdleTimeout) only catches a connection on which nothing arrives: a
// stream that stops while the connection carries other streams' frames
// (the agent's informers share one connection), or a request whose
// answer the server holds back, waits for minutes. The API server sends a
// bookmark on every watch about once a minute (AllowWatchBookmarks, which
// the reflector asks for), so silence well past that means the stream is
// stuck: this package then ends it, and the reflector watches again from
// the last resource version it saw.
package kubewatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// DefaultIdle is how long a watch may go without an event or a bookmark:
// a bookmark a minute, and room for a busy API server.
const DefaultIdle = 90 * time.Second

// Bounded wraps lw: a watch request with no answer, or a watch with
// nothing on it, for idle is ended (onIdle, if set, is told which and how
// long). Lists are lw's own. The result also implements
// cache.ListerWatcherWithContext, which the reflector prefers.
func Bounded(lw cache.ListerWatcher, idle time.Duration, onIdle func(what string, d time.Duration)) cache.ListerWatcher {
	if onIdle == nil {
		onIdle = func(string, time.Duration) {}
	}
	return &bounded{lw: cache.ToListerWatcherWithContext(lw), idle: idle, onIdle: onIdle}
}

type bounded struct {
	lw     cache.ListerWatcherWithContext
	idle   time.Duration
	onIdle func(string, time.Duration)
}

func (b *bounded) List(o metav1.ListOptions) (runtime.Object, error) {
	return b.lw.ListWithContext(context.Background(), o)
}

func (b *bounded) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	return b.lw.ListWithContext(ctx, o)
}

func (b *bounded) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return b.WatchWithContext(context.Background(), o)
}

func (b *bounded) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.AllowWatchBookmarks = true // the heartbeat this bound relies on
	wctx, cancel := context.WithCancel(ctx)
	// The request itself: the server may hold the answer back (a cache
	// not ready); cancelling the context aborts it.
	late := time.AfterFunc(b.idle, cancel)
	w, err := b.lw.WatchWithContext(wctx, o)
	if !late.Stop() {
		if w != nil {
			w.Stop()
		}
		cancel()
		b.onIdle("answer", b.idle)
		return nil, fmt.Errorf("watch: no answer from the API server in %s", b.idle)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	iw := &idleWatch{in: w, out: make(chan watch.Event), stop: make(chan struct{}), cancel: cancel}
	go iw.run(b.idle, b.onIdle)
	return iw, nil
}

// idleWatch relays in's events and ends when nothing came for idle. Only
// the wait for in counts: time spent handing an event to a slow consumer
// is not silence.
type idleWatch struct {
	in     watch.Interface
	out    chan watch.Event
	stop   chan struct{}
	once   sync.Once
	cancel context.CancelFunc
}

func (w *idleWatch) run(idle time.Duration, onIdle func(string, time.Duration)) {
	defer close(w.out)
	defer w.cancel()
	defer w.in.Stop()
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-w.in.ResultChan():
			if !ok {
				return
			}
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
			t.Reset(idle)
		case <-t.C:
			onIdle("events", idle)
			return
		case <-w.stop:
			return
		}
	}
}

func (w *idleWatch) Stop() { w.once.Do(func() { close(w.stop) }) }

func (w *idleWatch) ResultChan() <-chan watch.Event { return w.out }
