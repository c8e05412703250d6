package kubewatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

func lwOf(w watch.Interface, gotOpts *metav1.ListOptions) cache.ListerWatcher {
	return &cache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) { return &corev1.PodList{}, nil },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			*gotOpts = o
			return w, nil
		},
	}
}

func pod(rv string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ResourceVersion: rv}}
}

// TestEventsAndBookmarksKeepItOpen: events and bookmarks each restart the
// bound, so a watch that hears something more often than idle stays open;
// bookmarks are asked for.
func TestEventsAndBookmarksKeepItOpen(t *testing.T) {
	fw := watch.NewFake()
	var opts metav1.ListOptions
	var idled atomic.Int32
	lw := Bounded(lwOf(fw, &opts), 200*time.Millisecond, func(string, time.Duration) { idled.Add(1) }).(cache.ListerWatcherWithContext)
	w, err := lw.WatchWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if !opts.AllowWatchBookmarks {
		t.Error("the watch does not ask for bookmarks, the heartbeat the bound relies on")
	}
	for i := range 6 {
		time.Sleep(100 * time.Millisecond)
		if i%2 == 0 {
			fw.Add(pod("1"))
		} else {
			fw.Action(watch.Bookmark, pod("2"))
		}
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("closed after %d events though each came within the bound", i)
			}
			if want := []watch.EventType{watch.Added, watch.Bookmark}[i%2]; ev.Type != want {
				t.Fatalf("event %d: %s, want %s", i, ev.Type, want)
			}
		case <-time.After(time.Second):
			t.Fatalf("event %d not relayed", i)
		}
	}
	if n := idled.Load(); n != 0 {
		t.Errorf("reported idle %d times", n)
	}
}

// TestSilenceEndsIt: nothing for idle closes the result channel and stops
// the watch underneath (its stream is released).
func TestSilenceEndsIt(t *testing.T) {
	fw := watch.NewFake()
	var opts metav1.ListOptions
	var idled atomic.Int32
	w, err := Bounded(lwOf(fw, &opts), 150*time.Millisecond, func(what string, _ time.Duration) {
		if what == "events" {
			idled.Add(1)
		}
	}).Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case _, ok := <-w.ResultChan():
		if ok {
			t.Fatal("an event from nowhere")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a silent watch stayed open")
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("closed after %s, before the bound", d)
	}
	if !fw.IsStopped() {
		t.Error("the watch underneath was not stopped")
	}
	if idled.Load() != 1 {
		t.Errorf("idle reported %d times, want 1", idled.Load())
	}
}

// TestSlowConsumerIsNotSilence: time the reader takes to receive an event
// is not counted: the watch stays open while the source keeps talking.
func TestSlowConsumerIsNotSilence(t *testing.T) {
	fw := watch.NewRaceFreeFake()
	var opts metav1.ListOptions
	w, err := Bounded(lwOf(fw, &opts), 150*time.Millisecond, nil).Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	fw.Add(pod("1"))
	time.Sleep(400 * time.Millisecond) // the consumer is busy: the event waits
	if ev, ok := <-w.ResultChan(); !ok || ev.Type != watch.Added {
		t.Fatalf("got %v %v, want the event that waited for the consumer", ev.Type, ok)
	}
	fw.Add(pod("2"))
	if ev, ok := <-w.ResultChan(); !ok || ev.Type != watch.Added {
		t.Fatalf("got %v %v after a slow read, want the next event", ev.Type, ok)
	}
}

// TestStop: Stop closes the result channel and the watch underneath.
func TestStop(t *testing.T) {
	fw := watch.NewFake()
	var opts metav1.ListOptions
	w, err := Bounded(lwOf(fw, &opts), time.Hour, nil).Watch(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	w.Stop() // twice is fine, as for the reflector's
	select {
	case _, ok := <-w.ResultChan():
		if ok {
			t.Fatal("an event after Stop")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Stop left the result channel open")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !fw.IsStopped() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !fw.IsStopped() {
		t.Error("the watch underneath was not stopped")
	}
}
