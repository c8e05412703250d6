// Package bpfname reads the C names bpf2go records in its generated structs
// (the `ebpf` tag of each field), so that code names a map or a program by
// the generated field, which the compiler checks, rather than by a
// hand-spelled string that silently goes stale when the C name changes.
package bpfname

import (
	"fmt"
	"reflect"
	"sync"
)

// Of returns the C name of the field of *s that field points to, e.g.
// Of(&specs, &specs.CniLinks) is "cni_links"; fields of struct fields are
// found too, so one value can gather several objects' generated structs. A
// field that is not one of *s's, or has no ebpf tag, is a programming
// error: Of panics, at package initialisation where names are taken.
func Of[S any](s *S, field any) string {
	base := reflect.ValueOf(s).Pointer()
	at := reflect.ValueOf(field).Pointer()
	if at >= base {
		if name, ok := tagsOf(reflect.TypeOf(s).Elem())[at-base]; ok {
			return name
		}
	}
	panic(fmt.Sprintf("bpfname: %T at %#x is no tagged field of %T", field, at, s))
}

// tags caches, per struct type, the ebpf tag of each tagged field by its
// offset: every name a package takes at init then costs a map lookup, not
// a walk over the fields (the plugin runs its init at every verb).
var tags sync.Map // reflect.Type -> map[uintptr]string

func tagsOf(t reflect.Type) map[uintptr]string {
	if m, ok := tags.Load(t); ok {
		return m.(map[uintptr]string)
	}
	m := map[uintptr]string{}
	collect(t, 0, m)
	tags.Store(t, m)
	return m
}

// collect adds the tagged fields of t, at offset off in the outer struct.
func collect(t reflect.Type, off uintptr, into map[uintptr]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		switch {
		case f.Type.Kind() == reflect.Struct:
			collect(f.Type, off+f.Offset, into)
		case f.Type.Size() > 0 && f.Tag.Get("ebpf") != "":
			into[off+f.Offset] = f.Tag.Get("ebpf")
		}
	}
}
