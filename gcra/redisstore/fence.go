package redisstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/meridian-quota/meridian/gcra"
)

// The region fence (gcra.Fence, package rebalance's invariant 1): one key,
// Prefix + "meridian-fence", holding the (term, epoch) of the newest table
// an agent of the region has applied as 16 bytes (two big-endian 64-bit
// integers). The decision script refuses a fenced check below it, or any
// fenced check while it is missing, with gcra.ErrFenced; RaiseFence only
// raises it. On a Cluster there is no one key every slot's script can read,
// so a Cluster store keeps no fence: RaiseFence reports identity 0 and
// fenced checks are decided unfenced (the coordinator then waits for
// leases, as without fencing).

// raiseScript raises the fence to (ARGV[1], ARGV[2]) unless it holds a
// fence at least that, and returns the fence held.
var raiseScript = redis.NewScript(`
local t, e = tonumber(ARGV[1]), tonumber(ARGV[2])
local ok, v = pcall(redis.call, 'GET', KEYS[1])
local ht, he
if ok and type(v) == 'string' and #v == 16 then
  ht, he = struct.unpack('>i8i8', v)
end
if not ht or t > ht or (t == ht and e > he) then
  redis.call('SET', KEYS[1], struct.pack('>i8i8', t, e))
  ht, he = t, e
end
return {ht, he}
`)

// defaultFenceWait is Config.FenceWait's 0: the longest RaiseFence waits
// for replicas to confirm a fence write. It runs beside the decisions, once
// per table, so a loaded replica may take its time.
const defaultFenceWait = time.Second

var _ gcra.Fencer = (*Store)(nil)

// RaiseFence implements gcra.Fencer on a single node or Sentinel: on one
// connection it raises the fence, reads the server's run_id and replica
// count (INFO), and where there are replicas waits (WAIT, at most
// Config.FenceWait)
// until every connected one has the write — a failover to a replica that
// lacked it would hold an older fence, which admits what the newer one
// refused. The identity is a hash of the run_id and the prefix: a restart
// or failover changes it. Unconfirmed by a replica, it fails. On a Cluster
// it returns identity 0 and does nothing.
func (s *Store) RaiseFence(ctx context.Context, f gcra.Fence) (gcra.Fence, uint64, error) {
	if s.cluster {
		return gcra.Fence{}, 0, nil
	}
	if f.IsZero() || f.Term >= 1<<53 || f.Epoch >= 1<<53 {
		return gcra.Fence{}, 0, fmt.Errorf("%w: fence (term %d, epoch %d): must be nonzero with both below 2^53", ErrBadInput, f.Term, f.Epoch)
	}
	cl, ok := s.uc.(*redis.Client)
	if !ok {
		return gcra.Fence{}, 0, fmt.Errorf("redisstore: RaiseFence: client %T is not supported", s.uc)
	}
	wait := s.cfg.FenceWait
	if wait == 0 {
		wait = defaultFenceWait
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.Timeout, time.Second)+wait)
	defer cancel()
	conn := cl.Conn()
	defer conn.Close()
	reply, err := raiseScript.Run(ctx, conn, []string{s.fenceKey}, strconv.FormatUint(f.Term, 10), strconv.FormatUint(f.Epoch, 10)).Int64Slice()
	if err != nil {
		return gcra.Fence{}, 0, fmt.Errorf("redisstore: raise fence: %w", err)
	}
	if len(reply) != 2 || reply[0] < 0 || reply[1] < 0 {
		return gcra.Fence{}, 0, fmt.Errorf("%w: raise fence answered %v", ErrReply, reply)
	}
	held := gcra.Fence{Term: uint64(reply[0]), Epoch: uint64(reply[1])}
	info, err := conn.Info(ctx, "server", "replication").Result()
	if err != nil {
		return gcra.Fence{}, 0, fmt.Errorf("redisstore: raise fence: INFO: %w", err)
	}
	runID, replicas, err := parseInfo(info)
	if err != nil {
		return gcra.Fence{}, 0, err
	}
	if replicas > 0 {
		n, err := conn.Wait(ctx, replicas, wait).Result()
		if err != nil {
			return gcra.Fence{}, 0, fmt.Errorf("redisstore: raise fence: WAIT: %w", err)
		}
		if n < int64(replicas) {
			return gcra.Fence{}, 0, fmt.Errorf("redisstore: raise fence: %d of %d replicas confirmed the write within %s", n, replicas, wait)
		}
	}
	h := fnv.New64a()
	h.Write([]byte(runID))
	h.Write([]byte{0})
	h.Write([]byte(s.cfg.Prefix))
	return held, h.Sum64() | 1, nil
}

// parseInfo reads run_id and connected_slaves from INFO's text.
func parseInfo(info string) (runID string, replicas int, err error) {
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			runID = v
		} else if v, ok := strings.CutPrefix(line, "connected_slaves:"); ok {
			if replicas, err = strconv.Atoi(v); err != nil || replicas < 0 {
				return "", 0, fmt.Errorf("%w: INFO connected_slaves %q", ErrReply, v)
			}
		}
	}
	if runID == "" {
		return "", 0, errors.New("redisstore: raise fence: INFO has no run_id")
	}
	return runID, replicas, nil
}
