//go:build ignore

/*
 * Not a program: compiled only so bpf2go can emit the map specs of
 * lib/maps.h and the Go twins of the structs in lib/types.h into pkg/maps.
 */
#include "lib/maps.h"

/* Reference the enums so they land in BTF and bpf2go generates Go constants. */
enum cni_dir __dir_unused __attribute__((unused));
enum cni_reason __reason_unused __attribute__((unused));
enum hp_stat __hp_stat_unused __attribute__((unused));
enum hp_frag_stat __hp_frag_stat_unused __attribute__((unused));
enum masq_stat __masq_stat_unused __attribute__((unused));
enum ev_type __ev_type_unused __attribute__((unused));
enum ev_prog __ev_prog_unused __attribute__((unused));
/* The ring buffer has no value type: the record struct is referenced here. */
struct cni_event __event_unused __attribute__((unused));
/* Only inner maps (cni_pol_ct_parts', cni_pol_frag_parts') use these: BTF would hold them as
 * forward declarations, which have no size. */
struct pol_ct_key __pol_ct_key_unused __attribute__((unused));
struct pol_ct_val __pol_ct_val_unused __attribute__((unused));
struct pol_frag_key __pol_frag_key_unused __attribute__((unused));

char __license[] SEC("license") = "Dual BSD/GPL";
