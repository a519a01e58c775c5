package gossip

import "github.com/meridian-quota/meridian/gossip/protocol"

// The adapters provide the protocol's ports.
var (
	_ protocol.Bus        = (*Transport)(nil)
	_ protocol.TableStore = (*Transport)(nil)
	_ protocol.Membership = (*Members)(nil)
)
