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
// Of(&specs, &specs.CniLinks) is "cni_links"; fields of struct fields are
// found too, so one value can gather several objects' generated structs. A
// field that is not one of *s's, or has no ebpf tag, is a programming
// error: Of panics, at package initialisation where names are taken.
func Of[S any](s *S, field any) string {
	at := reflect.ValueOf(field).Pointer()
	if name, ok := tagAt(reflect.TypeOf(s).Elem(), reflect.ValueOf(s).Pointer(), at); ok {
		return name
	}
	panic(fmt.Sprintf("bpfname: %T at %#x is no tagged field of %T", field, at, s))
}

// tagAt finds the ebpf tag of the field at address at in a t at base.
func tagAt(t reflect.Type, base, at uintptr) (string, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct {
			if name, ok := tagAt(f.Type, base+f.Offset, at); ok {
				return name, true
			}
			continue
		}
		if base+f.Offset == at && f.Type.Size() > 0 {
			if name := f.Tag.Get("ebpf"); name != "" {
				return name, true
			}
		}
	}
	return "", false
}
