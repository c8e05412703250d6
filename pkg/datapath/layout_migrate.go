package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/ebpf-cni/ebpf-cni/pkg/maps"
)

// HasOlderLayout tells whether an older build's maps are pinned in pinRoot
// (Ensure migrates them).
func HasOlderLayout(pinRoot string) bool { return len(olderLayouts(pinRoot)) > 0 }

// OlderLayoutDirs lists the map directories of older layouts in pinRoot.
func OlderLayoutDirs(pinRoot string) []string {
	var out []string
	for _, o := range olderLayouts(pinRoot) {
		out = append(out, o.dir)
	}
	return out
}

// migrateLayout moves a node from an older map layout to this build's, in
// one go, under the pin directory's lock (called by Ensure: the first ADD
// of the new build, its first DEL, or the agent's start, whichever comes
// first). Pods attached by the older build keep working throughout:
//
//  1. the new maps are created in a staging directory, this build's
//     programs are loaded over them (every one the swap needs), and then
//     every entry of the old maps is copied in (endpoints, links, limits,
//     hostPorts, flows, counters, cluster CIDRs);
//  2. every pinned link, the node hooks' first (uplinks: see
//     upgradeLocked) and the old pods' host veths', is swapped to this
//     build's programs in place (link.Update: no packet meets a detached
//     hook);
//  3. the staging directory is renamed into place, which is what makes
//     Open succeed from then on, and what the old programs wrote between 1
//     and 2 (a learned MAC, a new flow) is copied too;
//  4. the old maps are unpinned, and the old programs' pins removed, once
//     every link moved (otherwise they stay, and `ebpf-agent upgrade`
//     retries the links).
//
// A killed migration leaves the staging directory, which the next one
// starts over with; the old maps are untouched until step 4.
func migrateLayout(pinRoot string, s maps.Sizing, older []oldLayout, seed func(*maps.Maps)) (*Datapath, error) {
	staging := StagingMapsDir(pinRoot)
	if err := os.RemoveAll(staging); err != nil {
		return nil, fmt.Errorf("remove the staging directory of a migration killed part way, %s: %w", staging, err)
	}
	// This build's program pins left by a migration killed part way run
	// over its staging maps: load them afresh (links running them are
	// swapped again below).
	removeCurrentProgramPins(pinRoot)
	m, err := maps.Create(staging, s)
	if err != nil {
		return nil, err
	}
	copyOld := func(m *maps.Maps) error {
		var errs error
		for _, o := range older {
			if _, err := m.MigrateFrom(o.dir, o.version); err != nil {
				errs = errors.Join(errs, fmt.Errorf("migrate the maps of layout v%d at %s: %w", o.version, o.dir, err))
			}
		}
		return errs
	}
	// The programs are loaded first (all of them: upgradeLocked loads the
	// uplinks' and the node hooks' before calling back), the entries copied
	// right before the links move: what the old programs count or refresh
	// between the copy and the swap is not carried over, so that window is
	// kept to the swap itself, however long the verifier takes.
	dp, err := withPrograms(pinRoot, m, loadMissing)
	if err != nil {
		os.RemoveAll(staging)
		return nil, err
	}
	var (
		copyErr error
		seeded  bool
	)
	_, upErr := dp.upgradeLocked(false, func() error {
		if copyErr = copyOld(dp.Maps); copyErr != nil {
			return copyErr
		}
		// After the copy (an entry written here wins over the old one,
		// and the copy after the rename keeps it), before the swap. The
		// peers' addresses are best effort: the agent's follower acquires
		// them again and logs what fails (a full cni_cluster_cidrs).
		_ = seedPeerAddresses(dp.Maps)
		if seed != nil {
			seed(dp.Maps)
			seeded = true
		}
		crashpoint("migrate-copied")
		return nil
	})
	dp.Close()
	if copyErr != nil {
		// No link moved: the old build keeps the node.
		os.RemoveAll(staging)
		removeCurrentProgramPins(pinRoot) // they run over the staging maps
		return nil, &MigrationError{Err: copyErr}
	}
	crashpoint("migrate-swapped")
	return finishMigration(pinRoot, older, copyOld, seeded, upErr)
}

// finishMigration is migrateLayout once the links moved (upErr: not all
// of them): the staging maps renamed into place, what the old programs
// wrote meanwhile copied, and the old maps unpinned if every link moved.
func finishMigration(pinRoot string, older []oldLayout, copyOld func(*maps.Maps) error, seeded bool, upErr error) (_ *Datapath, err error) {
	final, staging := MapsDir(pinRoot), StagingMapsDir(pinRoot)
	os.Remove(final) // an empty directory in the way; a full one makes Rename fail
	if err := os.Rename(staging, final); err != nil {
		return nil, fmt.Errorf("move the migrated maps %s to %s: %w", staging, final, err)
	}
	crashpoint("migrate-renamed")
	dp, err := Open(pinRoot)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			dp.Close()
		}
	}()
	if err := copyOld(dp.Maps); err != nil {
		return nil, &MigrationError{Err: err}
	}
	dp.seeded = seeded // else EnsureSeeded seeds it (the upgrade stopped before its swap)
	if upErr != nil {
		return nil, fmt.Errorf("migrated the maps to layout v%d, but not every attachment moved to this build's programs (they keep the old maps until `ebpf-agent upgrade` moves them): %w",
			maps.LayoutVersion, upErr)
	}
	for _, o := range older {
		if err := os.RemoveAll(o.dir); err != nil {
			return nil, fmt.Errorf("remove the maps of layout v%d at %s: %w", o.version, o.dir, err)
		}
	}
	return dp, nil
}

// MigrationError: the maps of an older layout could not be copied into
// this build's (one too small for them names itself and its size).
type MigrationError struct{ Err error }

func (e *MigrationError) Error() string { return e.Err.Error() }
func (e *MigrationError) Unwrap() error { return e.Err }

// removeCurrentProgramPins unpins this build's programs (a migration's
// that ran over its staging maps).
func removeCurrentProgramPins(pinRoot string) {
	for _, p := range ProgramPins(pinRoot) {
		if p.Current {
			os.Remove(p.Path)
		}
	}
}
