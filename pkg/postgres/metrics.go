package postgres

import "github.com/prometheus/client_golang/prometheus"

// poolCollector exports the connection pool's counters at scrape time.
type poolCollector struct {
	db                                                   *DB
	total, idle, acquired, max, acquires, waits, waitSec *prometheus.Desc
}

// Collector reports the pool: connections by state, acquisitions, and how
// often and how long callers waited for a connection (a pool too small
// for the load shows up here first).
func (db *DB) Collector() prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("settle_db_pool_"+name, help, nil, nil)
	}
	return &poolCollector{
		db:       db,
		total:    d("connections", "Open connections."),
		idle:     d("idle_connections", "Idle connections."),
		acquired: d("acquired_connections", "Connections in use."),
		max:      d("max_connections", "The pool's bound."),
		acquires: d("acquires_total", "Connections handed out."),
		waits:    d("empty_acquires_total", "Acquisitions that had to wait for a free connection."),
		waitSec:  d("acquire_wait_seconds_total", "Time spent waiting for connections."),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.total, c.idle, c.acquired, c.max, c.acquires, c.waits, c.waitSec} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.db.pool.Stat()
	ch <- prometheus.MustNewConstMetric(c.total, prometheus.GaugeValue, float64(s.TotalConns()))
	ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, float64(s.IdleConns()))
	ch <- prometheus.MustNewConstMetric(c.acquired, prometheus.GaugeValue, float64(s.AcquiredConns()))
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(s.MaxConns()))
	ch <- prometheus.MustNewConstMetric(c.acquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.waitSec, prometheus.CounterValue, s.AcquireDuration().Seconds())
}
