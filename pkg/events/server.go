package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// SocketName is the agent's socket in the state directory. A unix socket,
// not the metrics listener: events name every pod's addresses and peers,
// which only root may read here (the socket is 0600, like the pinned maps
// the other commands read), while the metrics listener is optional and
// often reachable from the pod network for scraping.
const SocketName = "agent.sock"

// SocketPath is where the agent of stateDir listens.
func SocketPath(stateDir string) string { return filepath.Join(stateDir, SocketName) }

// Listen creates the agent's socket at path, replacing one left by a
// killed agent. The agent listens before it says it is ready, so observe
// never finds a ready agent without its socket.
func Listen(path string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("events socket %s: another agent answers on it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("events socket %s: remove the stale one: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("events socket: %w", err)
	}
	// Not umask: it is the whole process's, and the agent creates
	// directories meanwhile. The state directory is 0700 (safedir), so
	// nobody else reaches the socket before the chmod either.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("events socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("events socket: %w", err)
	}
	return ln, nil
}

// Serve answers observe's requests on ln (from Listen) until ctx ends,
// then removes the socket.
func Serve(ctx context.Context, ln net.Listener, r *Reader) error {
	srv := &http.Server{Handler: r.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(ln)
	os.Remove(ln.Addr().String())
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Handler serves GET /v1/events (JSON lines) and GET /v1/status.
func (r *Reader) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, req *http.Request) {
		st, err := r.Status()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("GET /v1/events", r.serveEvents)
	return mux
}

// Query is what observe asks for.
type Query struct {
	Filter
	Last   int  // the last Last kept records first (0: none)
	Follow bool // then the records as they come, until the client goes
}

func (q Query) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("pod", q.Pod)
	set("verdict", q.Verdict)
	set("protocol", q.Protocol)
	if !q.Since.IsZero() {
		v.Set("since", q.Since.Format(time.RFC3339Nano))
	}
	if q.Last > 0 {
		v.Set("last", strconv.Itoa(q.Last))
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	return v
}

func parseQuery(v url.Values) (Query, error) {
	q := Query{Filter: Filter{Pod: v.Get("pod"), Verdict: v.Get("verdict"), Protocol: v.Get("protocol")}, Follow: v.Get("follow") == "1"}
	if s := v.Get("since"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, fmt.Errorf("since %q: %w", s, err)
		}
		q.Since = t
	}
	if s := v.Get("last"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, fmt.Errorf("last %q: want a count", s)
		}
		q.Last = n
	}
	if !q.Since.IsZero() && q.Last == 0 {
		q.Last = DefaultKeep * 16 // every kept record since then
	}
	return q, q.Filter.Validate()
}

// lossReport is how often a follower is told of events lost meanwhile.
const lossReport = time.Second

func (r *Reader) serveEvents(w http.ResponseWriter, req *http.Request) {
	q, err := parseQuery(req.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if _, err := r.Status(); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	fl, _ := w.(http.Flusher)
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	if !q.Follow {
		for _, rec := range r.Last(q.Filter, q.Last) {
			if WriteJSON(w, &rec) != nil {
				return
			}
		}
		return
	}
	hist, sub := r.Subscribe(q.Filter, q.Last)
	defer sub.Close()
	for _, rec := range hist {
		if WriteJSON(w, &rec) != nil {
			return
		}
	}
	flush()
	// Losses are reported as they happen, whatever the filter: the
	// datapath's (rate limit, full ring) for all events, and this
	// follower's own.
	base, _ := r.Status()
	var slow uint64
	tick := time.NewTicker(lossReport)
	defer tick.Stop()
	for {
		select {
		case <-req.Context().Done():
			return
		case rec := <-sub.C():
			if WriteJSON(w, &rec) != nil {
				return
			}
			// Write what is queued, then flush once.
			for n := len(sub.C()); n > 0; n-- {
				rec := <-sub.C()
				if WriteJSON(w, &rec) != nil {
					return
				}
			}
			flush()
		case <-tick.C:
			st, err := r.Status()
			if err != nil {
				return
			}
			l := Losses{RateLimited: st.LostRate - base.LostRate, RingFull: st.LostRing - base.LostRing, SlowObserver: sub.Slow() - slow}
			if l.RateLimited+l.RingFull+l.SlowObserver == 0 {
				continue
			}
			base.LostRate, base.LostRing, slow = st.LostRate, st.LostRing, slow+l.SlowObserver
			rec := Record{Time: time.Now(), Type: "lost", Lost: &l}
			if WriteJSON(w, &rec) != nil {
				return
			}
			flush()
		}
	}
}

// Losses are events lost since the last report.
type Losses struct {
	RateLimited  uint64 `json:"rateLimited"`  // over the per-CPU rate (all events of the node)
	RingFull     uint64 `json:"ringFull"`     // the ring buffer was full (all events of the node)
	SlowObserver uint64 `json:"slowObserver"` // matching this filter, this observer fell behind
}
