package gossip

import "context"

// Flush waits until the NATS server has every report and ack published so
// far (a round trip on the publishing connection), or ctx ends; ctx needs
// a deadline.
func (t *Transport) Flush(ctx context.Context) error {
	return t.pub.FlushWithContext(ctx)
}
