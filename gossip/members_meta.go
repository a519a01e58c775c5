package gossip

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
)

// Node metadata as memberlist carries it (Node.Meta, at most
// memberlist.MetaMaxSize bytes). Region and Agent are not in it: they are
// the node name, Region "/" Agent, which memberlist already carries and
// keeps unique. The layout is
//
//	byte 0   format (1)
//	byte 1   flags: bit 0 = leaving (Leave has begun)
//	uvarint  len(Role), Role
//	uvarint  len(Version), Version
//
// Later formats may only append fields, so a reader of format 1 decodes
// any format ≥ 1 by ignoring what follows.
const (
	metaFormat       = 1
	metaFlagLeaving  = 1 << 0
	metaHeaderLength = 2
)

// encodeMeta encodes a member's role, version and leaving flag.
func encodeMeta(m Meta, leaving bool) []byte {
	b := make([]byte, 0, metaHeaderLength+2*binary.MaxVarintLen16+len(m.Role)+len(m.Version))
	var flags byte
	if leaving {
		flags |= metaFlagLeaving
	}
	b = append(b, metaFormat, flags)
	for _, s := range []string{m.Role, m.Version} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

var errMeta = errors.New("malformed member metadata")

// decodeMeta decodes what encodeMeta wrote, with Region and Agent taken
// from the node name. It never panics on bytes from the network.
func decodeMeta(name string, b []byte) (m Meta, leaving bool, err error) {
	m.Region, m.Agent = splitNodeName(name)
	if len(b) < metaHeaderLength || b[0] < metaFormat {
		return m, false, errMeta
	}
	leaving = b[1]&metaFlagLeaving != 0
	rest := b[metaHeaderLength:]
	var fields [2]string
	for i := range fields {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return m, false, errMeta
		}
		fields[i] = string(rest[k : k+int(n)])
		rest = rest[k+int(n):]
	}
	m.Role, m.Version = fields[0], fields[1]
	return m, leaving, nil
}

// nodeName is the memberlist node name of a member.
func nodeName(m Meta) string { return m.Region + "/" + m.Agent }

// splitNodeName splits a node name at its first "/" (regions have none);
// a name without one is not a Meridian member: Region is empty.
func splitNodeName(name string) (region, agent string) {
	region, agent, ok := strings.Cut(name, "/")
	if !ok {
		return "", name
	}
	return region, agent
}

// memberLogWriter routes memberlist's log lines into slog. memberlist
// writes "[LEVEL] memberlist: message" lines through a *log.Logger; each
// Write is one line. DEBUG (and TRACE) lines are dropped; ERR and ERROR
// become slog errors; a line without a level is logged at Info.
// Once the member is stopping, every line is logged at Debug: memberlist's
// goroutines report the sockets closed by Shutdown as errors. memberlist
// never logs key material. Safe for concurrent use.
type memberLogWriter struct {
	log      *slog.Logger
	stopping *atomic.Bool // set: log at Debug
}

func (w memberLogWriter) Write(p []byte) (int, error) {
	level, msg, ok := parseMemberlistLine(string(p))
	if ok {
		if w.stopping != nil && w.stopping.Load() {
			level = slog.LevelDebug
		}
		w.log.Log(context.Background(), level, msg, "component", "memberlist")
	}
	return len(p), nil
}

// parseMemberlistLine splits one memberlist log line into its slog level
// and message; ok is false for lines to drop.
func parseMemberlistLine(line string) (level slog.Level, msg string, ok bool) {
	line = strings.TrimRight(line, "\r\n")
	level = slog.LevelInfo
	if rest, found := strings.CutPrefix(line, "["); found {
		if tag, text, found := strings.Cut(rest, "]"); found {
			switch tag {
			case "TRACE", "DEBUG":
				return 0, "", false
			case "INFO":
				level = slog.LevelInfo
			case "WARN", "WARNING":
				level = slog.LevelWarn
			case "ERR", "ERROR":
				level = slog.LevelError
			default:
				tag = ""
			}
			if tag != "" {
				line = text
			}
		}
	}
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "memberlist: ")
	if line == "" {
		return 0, "", false
	}
	return level, line, true
}
