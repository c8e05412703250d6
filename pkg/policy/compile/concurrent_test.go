package compile

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

// TestConcurrentUse: informer handlers upsert and delete while the agent's
// workers compile and drain the dirty set; run under -race (make race) it
// proves the locking, and the final state still equals a fresh snapshot's.
func TestConcurrentUse(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	w := randWorld(r)
	s := w.snapshot(t)
	// Pre-draw the updates: the world's generator is not for concurrent use.
	type op func()
	var writers [3][]op
	for i := range writers {
		for j := range 200 {
			ns := rNS[(i+j)%len(rNS)]
			switch j % 4 {
			case 0:
				p := randPod(r, w, ns, pick(r, rPodNames))
				w.pods[PodKey{p.Namespace, p.Name}] = p
				writers[i] = append(writers[i], func() { s.UpsertPod(p) })
			case 1:
				l := randLabels(r)
				l[nsKey] = ns
				writers[i] = append(writers[i], func() { s.UpsertNamespace(ns, l) })
			case 2:
				np := randPolicy(r, ns, fmt.Sprintf("p%d", r.IntN(3)))
				writers[i] = append(writers[i], func() { _ = s.UpsertPolicy(np) })
			case 3:
				name := pick(r, rPodNames)
				writers[i] = append(writers[i], func() { s.DeletePod(ns, name) })
			}
		}
	}
	var wg sync.WaitGroup
	for _, ops := range writers {
		wg.Go(func() {
			for _, o := range ops {
				o()
			}
		})
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, k := range s.TakeDirty() {
					if ep, ok := s.Endpoint(k.Namespace, k.Name); ok {
						_ = len(ep.Ingress.Allows) + len(ep.Egress.Allows)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()

	// Whatever the interleaving, the snapshot equals one built from its
	// final objects: rebuild from what it holds and compare endpoints.
	s.mu.Lock()
	final := New()
	for n, l := range s.namespaces {
		final.namespaces[n] = l
	}
	for _, byName := range s.pods {
		for _, p := range byName {
			final.UpsertPod(*p)
		}
	}
	var pols []*policyEntry
	for _, byName := range s.policies {
		for _, pe := range byName {
			pols = append(pols, pe)
		}
	}
	s.mu.Unlock()
	for _, pe := range pols {
		final.mu.Lock()
		byName := final.policies[pe.key.Namespace]
		if byName == nil {
			byName = map[string]*policyEntry{}
			final.policies[pe.key.Namespace] = byName
		}
		fe := &policyEntry{parsedPolicy: pe.parsedPolicy, selected: map[string]struct{}{}}
		for name, pod := range final.pods[pe.key.Namespace] {
			if pe.podSel.Matches(labels.Set(pod.Labels)) {
				final.setSelected(fe, name, true)
			}
		}
		byName[pe.key.Name] = fe
		final.mu.Unlock()
	}
	for _, ns := range rNS {
		for _, name := range rPodNames {
			got, ok := s.Endpoint(ns, name)
			want, wok := final.Endpoint(ns, name)
			if ok != wok || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("%s/%s: concurrent %v %+v, fresh %v %+v", ns, name, ok, got, wok, want)
			}
		}
	}
}
