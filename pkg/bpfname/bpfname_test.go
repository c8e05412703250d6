package bpfname

import "testing"

type specs struct {
	First  *int `ebpf:"cni_first"`
	Second *int `ebpf:"cni_second"`
	Plain  *int
	Nested struct {
		Third *int `ebpf:"cni_third"`
	}
}

func TestOf(t *testing.T) {
	var s specs
	if got := Of(&s, &s.First); got != "cni_first" {
		t.Errorf("Of(First) = %q, want cni_first", got)
	}
	if got := Of(&s, &s.Second); got != "cni_second" {
		t.Errorf("Of(Second) = %q, want cni_second", got)
	}
	if got := Of(&s, &s.Nested.Third); got != "cni_third" {
		t.Errorf("Of(Nested.Third) = %q, want cni_third", got)
	}
}

func TestOfPanics(t *testing.T) {
	var s specs
	var other int
	for name, field := range map[string]any{"untagged field": &s.Plain, "foreign pointer": &other} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("Of(%s) did not panic", name)
				}
			}()
			Of(&s, field)
		})
	}
}
