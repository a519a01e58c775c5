package gossip

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/meridian-quota/meridian/gossip/protocol"
)

// natsKV is the election's protocol.KV over the transport's JetStream
// bucket. It maps the bucket's answers to the port's sentinels (still
// wrapping jetstream's, so errors.Is finds either) and passes every other
// error through as it came, for the caller to wrap.
type natsKV struct{ kv jetstream.KeyValue }

var _ protocol.KV = natsKV{}

func (k natsKV) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := k.kv.Get(ctx, key)
	if err != nil {
		return nil, 0, kvPortErr(err)
	}
	return e.Value(), e.Revision(), nil
}

func (k natsKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.kv.Create(ctx, key, value)
	return rev, kvPortErr(err)
}

func (k natsKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	rev, err := k.kv.Update(ctx, key, value, rev)
	return rev, kvPortErr(err)
}

// kvPortErr names a JetStream KV error by the port's sentinel: an absent
// key ErrNotFound, a failed compare-and-set ErrConflict.
func kvPortErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: %w", protocol.ErrNotFound, err)
	case isConflict(err):
		return fmt.Errorf("%w: %w", protocol.ErrConflict, err)
	}
	return err
}
