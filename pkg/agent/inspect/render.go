// Package inspect is the agent's read-only view of a node: the datapath's
// status and one dump per map family, each a Report that renders as
// aligned tables or as JSON (-o json).
package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Source is what the inspections read: the node's pinned datapath and the
// plugin's attachment records (which name the pods behind map entries).
type Source struct {
	PinDir   string
	StateDir string
}

// Report is the result of one inspection. Its JSON form is the value itself;
// Tables is its table form.
type Report interface {
	Tables() []Table
}

// Table is one block of the table form: free lines first (a summary), then
// rows under a header, aligned, then a footer line.
type Table struct {
	Lines  []string
	Header []string
	Rows   [][]string
	Footer string
}

// Write renders r as "table" (or "") or "json".
func Write(w io.Writer, r Report, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case "", "table":
		for i, t := range r.Tables() {
			if i > 0 {
				fmt.Fprintln(w)
			}
			if err := t.write(w); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown output format %q (want table or json)", format)
}

func (t Table) write(w io.Writer) error {
	for _, l := range t.Lines {
		fmt.Fprintln(w, l)
	}
	if len(t.Header) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
		for _, r := range t.Rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if t.Footer != "" {
		if len(t.Header) > 0 {
			fmt.Fprintln(w)
		}
		_, err := fmt.Fprintln(w, t.Footer)
		return err
	}
	return nil
}
