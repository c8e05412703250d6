// Package bpfname reads the C names bpf2go records in its generated structs
// (the `ebpf` tag of each field), so that code names a map or a program by
// the generated field, which the compiler checks, rather than by a
// hand-spelled string that silently goes stale when the C name changes.
package bpfname

import (
	"fmt"
	"reflect"
)

// Of returns the C name of the field of *s that field points to, e.g.
// Of(&specs, &specs.CniLinks) is "cni_links". A field that is not one of
// *s's, or has no ebpf tag, is a programming error: Of panics, at package
// initialisation where names are taken.
func Of[S any](s *S, field any) string {
	base := reflect.ValueOf(s).Pointer()
	at := reflect.ValueOf(field).Pointer()
	t := reflect.TypeOf(s).Elem()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if base+f.Offset != at || f.Type.Size() == 0 {
			continue
		}
		if name := f.Tag.Get("ebpf"); name != "" {
			return name
		}
	}
	panic(fmt.Sprintf("bpfname: %T at %#x is no tagged field of %s", field, at, t))
}
