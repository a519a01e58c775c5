package gossip

import (
	"errors"
	"fmt"
)

// Permissions are the NATS subjects one agent's user may publish and
// subscribe on, and nothing else: the allow lists of a nats-server user
// (authorization { users: [{user, password, permissions: {publish:
// {allow: Publish}, subscribe: {allow: Subscribe}}}] }).
type Permissions struct {
	Publish, Subscribe []string
}

// AgentPermissions returns what the transport of agent (region, agent) in
// cluster, with its table bucket, needs and may do on NATS — so that a
// server holding each agent to its own user makes a report or an ack
// published on another agent's subject a permission violation the server
// refuses, before the coordinator's own check (the sender a message
// claims must be the one its subject names) ever sees it.
//
// Every agent publishes its own reports and acks and reads the bucket
// (stream info, direct gets, and the ordered consumers of a watch, with
// their flow-control replies); replies come on _INBOX. A candidate also
// writes its cluster's keys in the bucket, creates the bucket if it is
// missing, purges old table chunks, and subscribes to every agent's
// reports and acks. No agent may delete or reconfigure the stream, write
// another cluster's keys, or publish on another agent's subjects.
func AgentPermissions(cluster, bucket, region, agent string, candidate bool) (Permissions, error) {
	var errs []error
	for _, n := range []struct{ what, v string }{{"cluster", cluster}, {"bucket", bucket}, {"region", region}, {"agent", agent}} {
		if err := checkName(n.v); err != nil {
			errs = append(errs, fmt.Errorf("gossip: %s: %w", n.what, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Permissions{}, err
	}
	subj := "meridian." + cluster + "."
	stream := "KV_" + bucket
	p := Permissions{
		Publish: []string{
			subj + "report." + region + "." + agent,
			subj + "ack." + region + "." + agent,
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + stream,
			"$JS.API.STREAM.MSG.GET." + stream,
			"$JS.API.DIRECT.GET." + stream,
			"$JS.API.DIRECT.GET." + stream + ".>",
			"$JS.API.CONSUMER.CREATE." + stream,
			"$JS.API.CONSUMER.CREATE." + stream + ".>",
			"$JS.API.CONSUMER.INFO." + stream + ".>",
			"$JS.API.CONSUMER.DELETE." + stream + ".>",
			"$JS.FC." + stream + ".>",
		},
		Subscribe: []string{"_INBOX.>"},
	}
	if candidate {
		p.Publish = append(p.Publish,
			"$KV."+bucket+"."+cluster+".>",
			"$JS.API.STREAM.CREATE."+stream,
			"$JS.API.STREAM.PURGE."+stream,
		)
		p.Subscribe = append(p.Subscribe, subj+"report.*.*", subj+"ack.*.*")
	}
	return p, nil
}

// NATSUser is the user name [AgentPermissions]' user has in the NATS
// configuration `meridian keys` writes: "<region>.<agent>" (neither
// holds a '.', so no two agents share one).
func NATSUser(region, agent string) string { return region + "." + agent }
