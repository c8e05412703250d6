package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type resultsFile struct {
	CNI     string       `json:"cni"`
	Passed  int          `json:"passed"`
	Failed  int          `json:"failed"`
	Skipped int          `json:"skipped"`
	Seconds int          `json:"seconds"`
	Specs   []specResult `json:"specs"`
}

// compareResults writes one markdown table of several runs' results.json:
// a row per spec, a column per CNI; rows where the CNIs differ first.
func compareResults(w io.Writer, files []string) error {
	var runs []resultsFile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r resultsFile
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		runs = append(runs, r)
	}
	state := map[string][]string{}
	for i, r := range runs {
		for _, s := range r.Specs {
			if state[s.Name] == nil {
				state[s.Name] = make([]string, len(runs))
			}
			state[s.Name][i] = s.State
		}
	}
	var names []string
	for n := range state {
		names = append(names, n)
	}
	differ := func(n string) bool {
		for _, s := range state[n] {
			if s != state[n][0] {
				return true
			}
		}
		return false
	}
	sort.Slice(names, func(i, k int) bool {
		if di, dk := differ(names[i]), differ(names[k]); di != dk {
			return di
		}
		return names[i] < names[k]
	})
	fmt.Fprint(w, "| spec |")
	for _, r := range runs {
		fmt.Fprintf(w, " %s |", r.CNI)
	}
	fmt.Fprint(w, "\n|---|")
	for range runs {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, n := range names {
		fmt.Fprintf(w, "| %s |", strings.ReplaceAll(n, "|", "\\|"))
		for _, s := range state[n] {
			if s == "" {
				s = "not run"
			}
			fmt.Fprintf(w, " %s |", s)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, "| **total** (passed / failed / skipped) |")
	for _, r := range runs {
		fmt.Fprintf(w, " %d / %d / %d |", r.Passed, r.Failed, r.Skipped)
	}
	fmt.Fprintln(w)
	return nil
}
