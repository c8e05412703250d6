package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/ebpf-cni/ebpf-cni/pkg/datapath"
	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// ReadDirect follows the ring buffer itself, for observe with no agent
// running: the records matching f, until ctx ends or fn fails. Only one
// reader can consume the ring, so it must not run beside an agent (the
// caller asked the socket first). No history: the agent keeps that.
func ReadDirect(ctx context.Context, pinDir, stateDir string, f Filter, fn func(*Record) error) error {
	m, err := datapath.OpenMaps(pinDir)
	if err != nil {
		return err
	}
	defer m.Close()
	s, err := m.Events().Settings()
	if err != nil {
		return err
	}
	if !s.Enabled() {
		return errors.New("events are off on this node (no agent turned them on): start the agent, or `ebpf-agent events --drops on`")
	}
	rb, err := ringbuf.NewReader(m.Events().Ring())
	if err != nil {
		return fmt.Errorf("read the ring buffer: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { rb.Close() })
	defer stop()
	defer rb.Close()
	boot, n := maps.MonotonicZero(), newNames(stateDir)
	var rec ringbuf.Record
	var seq uint64
	for {
		if err := rb.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return nil
			}
			return err
		}
		e, err := maps.DecodeEvent(rec.RawSample)
		if err != nil {
			continue
		}
		r := newRecord(&e, boot, n)
		seq++
		r.Seq = seq
		if !f.Match(&r) {
			continue
		}
		if err := fn(&r); err != nil {
			return err
		}
	}
}
