package gossip

import (
	"github.com/prometheus/client_golang/prometheus"
)

// loopMetrics are the loop's series, every one initialised at start so
// dashboards and alerts see zeros rather than absent series.
type loopMetrics struct {
	msgs        *prometheus.CounterVec // kind, direction
	bytes       *prometheus.CounterVec // kind, direction
	errors      *prometheus.CounterVec // kind
	dropped     *prometheus.CounterVec // kind
	invalid     *prometheus.CounterVec // kind, reason
	tables      *prometheus.CounterVec // result
	deltas      *prometheus.CounterVec // outcome
	tableTerm   prometheus.Gauge
	tableEpoch  prometheus.Gauge
	members     *prometheus.GaugeVec // region
	leader      prometheus.Gauge
	coordTerm   prometheus.Gauge
	published   prometheus.Counter
	fenced      prometheus.Counter
	overwritten prometheus.Counter
	maxShareSum prometheus.Gauge
	keys        prometheus.Gauge
	overflow    prometheus.Counter
	skew        *prometheus.GaugeVec // region
}

func newLoopMetrics(reg prometheus.Registerer, regions []string) (*loopMetrics, error) {
	m := &loopMetrics{
		msgs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_messages_total",
			Help: "Control messages (wire chunks) by kind (report, ack, table) and direction (in, out)."}, []string{"kind", "direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_bytes_total",
			Help: "Bytes of control messages by kind and direction."}, []string{"kind", "direction"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_send_errors_total",
			Help: "Control messages that could not be sent or stored, by kind."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_dropped_total",
			Help: "Control messages dropped because a bounded queue was full, by kind."}, []string{"kind"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_invalid_messages_total",
			Help: "Inbound control messages refused (never applied), by kind and reason (signature, cluster, sender: a report or ack claiming another agent than its subject's, malformed, unavailable)."}, []string{"kind", "reason"}),
		tables: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_tables_total",
			Help: "Share tables received, by result: applied, stale (older or replayed term and epoch), refused (malformed for this node)."}, []string{"result"}),
		deltas: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_cluster_table_deltas_total",
			Help: "Delta table heads read, by outcome: patched (onto the table this agent held, no chunks fetched) or missed (on another base: the chunks were fetched)."}, []string{"outcome"}),
		tableTerm: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_cluster_table_term",
			Help: "Term of the newest table this agent applied."}),
		tableEpoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_cluster_table_epoch",
			Help: "Epoch of the newest table this agent applied."}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_cluster_members",
			Help: "Live agents by region, as membership sees them."}, []string{"region"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_coordinator_leader",
			Help: "1 while this agent is the coordinator."}),
		coordTerm: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_coordinator_term",
			Help: "The coordinator election's current term as the KV bucket shows it (0: none)."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_coordinator_tables_published_total",
			Help: "Tables this agent stored and published as coordinator."}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_coordinator_fenced_total",
			Help: "Terms this coordinator lost: a table write refused because another coordinator wrote first, or an agent reported running a table above the term's own."}),
		overwritten: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_coordinator_heads_overwritten_total",
			Help: "Table heads no coordinator wrote (forged, unverifiable or replayed) that this coordinator found fencing its write and stored over; none deposes it."}),
		maxShareSum: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_coordinator_share_sum_max_ppm",
			Help: "The largest sum of shares (ppm) over the keys of the last table this coordinator published; never above 1e6."}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{Name: "meridian_coordinator_keys",
			Help: "Keys the coordinator tracks."}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{Name: "meridian_coordinator_key_overflow_total",
			Help: "Reported keys not budgeted because the coordinator tracks its maximum (they run at the safe share)."}),
		skew: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "meridian_coordinator_clock_skew_seconds",
			Help: "Per region, its store's clock minus the coordinator's when its last report arrived (transit included)."}, []string{"region"}),
	}
	for _, k := range []string{"report", "ack", "table"} {
		for _, d := range []string{"in", "out"} {
			m.msgs.WithLabelValues(k, d)
			m.bytes.WithLabelValues(k, d)
		}
		m.errors.WithLabelValues(k)
		for _, r := range []string{"signature", "cluster", "sender", "malformed", "unavailable"} {
			m.invalid.WithLabelValues(k, r)
		}
	}
	for _, k := range []string{"report", "ack", "report_in", "ack_in"} {
		m.dropped.WithLabelValues(k)
	}
	for _, r := range []string{"applied", "stale", "refused"} {
		m.tables.WithLabelValues(r)
	}
	for _, o := range []string{"patched", "missed"} {
		m.deltas.WithLabelValues(o)
	}
	for _, r := range regions {
		m.members.WithLabelValues(r)
		m.skew.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.msgs, m.bytes, m.errors, m.dropped, m.invalid, m.tables, m.deltas,
			m.tableTerm, m.tableEpoch, m.members, m.leader, m.coordTerm, m.published, m.fenced, m.overwritten,
			m.maxShareSum, m.keys, m.overflow, m.skew} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
