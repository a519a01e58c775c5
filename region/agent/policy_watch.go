package agent

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
	"os"
	"path/filepath"

	"github.com/meridian-quota/meridian/region"
)

// PolicyOptions say how the policy is read when Config.Policy names a
// directory of envoyproxy/ratelimit files (region.LoadOptions); a single
// file ignores them.
type PolicyOptions struct {
	// MergeDomains merges files that name the same domain (upstream's
	// MERGE_DOMAIN_CONFIG); otherwise a domain in two files is an error.
	MergeDomains bool `yaml:"merge_domains"`
	// IgnoreDotFiles skips files and directories whose names start with a
	// dot (upstream's RUNTIME_IGNOREDOTFILES).
	IgnoreDotFiles bool `yaml:"ignore_dot_files"`
}

// LoadOptions is o as region.LoadPolicy takes it.
func (o PolicyOptions) LoadOptions() region.LoadOptions {
	return region.LoadOptions{MergeDomains: o.MergeDomains, IgnoreDotFiles: o.IgnoreDotFiles}
}

// policyDigest is a content hash of what the policy path holds, for
// polling: a file's bytes, or a directory's whole tree — every entry's
// name, every symbolic link's target and every regular file's bytes (of
// anything else, such as a FIFO, its type only), in name order
// (os.ReadDir sorts), following links. It changes when any file in the
// directory is edited, added or removed, and when a link is swapped to
// another tree (upstream's RUNTIME_WATCH_ROOT layout, a Kubernetes
// ConfigMap's ..data): whatever the modification times say. Dot entries
// are hashed too, whatever IgnoreDotFiles says: a reload that loads the
// same policy swaps nothing (Reload compares versions). What cannot be read
// is hashed as its error, so a path that goes missing or unreadable
// changes the digest once, and the reload that follows reports why.
func policyDigest(path string) [sha256.Size]byte {
	h := sha256.New()
	digestTree(h, path, ".", 0, map[string]bool{})
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// maxPolicyDepth bounds the directories digestTree descends (and so any
// cycle of links its visited set misses).
const maxPolicyDepth = 32

// digestTree writes the entry at path, named rel, into h: tagged records,
// each length-prefixed so that no two trees write the same bytes.
func digestTree(h hash.Hash, path, rel string, depth int, visited map[string]bool) {
	field := func(tag byte, s string) {
		var n [9]byte
		n[0] = tag
		binary.BigEndian.PutUint64(n[1:], uint64(len(s)))
		h.Write(n[:])
		io.WriteString(h, s)
	}
	field('n', rel)
	if target, err := os.Readlink(path); err == nil {
		field('l', target)
	}
	fi, err := os.Stat(path) // follows links
	if err != nil {
		field('e', err.Error())
		return
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		// A FIFO, socket or device: LoadPolicy skips it, and opening a
		// FIFO blocks until a writer comes. Its type is all that counts.
		field('m', fi.Mode().Type().String())
		return
	}
	if !fi.IsDir() {
		f, err := os.Open(path)
		if err != nil {
			field('e', err.Error())
			return
		}
		defer f.Close()
		var n [9]byte
		n[0] = 'f'
		binary.BigEndian.PutUint64(n[1:], uint64(fi.Size()))
		h.Write(n[:])
		if _, err := io.Copy(h, f); err != nil {
			field('e', err.Error())
		}
		return
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		field('e', err.Error())
		return
	}
	if visited[resolved] || depth >= maxPolicyDepth {
		field('c', resolved) // a cycle, or too deep: named, not followed
		return
	}
	visited[resolved] = true
	defer delete(visited, resolved)
	entries, err := os.ReadDir(path)
	if err != nil {
		field('e', err.Error())
		return
	}
	field('d', "")
	for _, e := range entries {
		digestTree(h, filepath.Join(path, e.Name()), filepath.Join(rel, e.Name()), depth+1, visited)
	}
}

// policyChanged reports whether the policy path's content differs from
// what was last loaded or rejected.
func (a *Agent) policyChanged() bool {
	d := policyDigest(a.cfg.Policy)
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	return d != a.policyAt
}
