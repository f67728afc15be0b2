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
	return &poolCollector{
		db:       db,
		total:    prometheus.NewDesc("settle_db_pool_connections", "Open connections.", nil, nil),
		idle:     prometheus.NewDesc("settle_db_pool_idle_connections", "Idle connections.", nil, nil),
		acquired: prometheus.NewDesc("settle_db_pool_acquired_connections", "Connections in use.", nil, nil),
		max:      prometheus.NewDesc("settle_db_pool_max_connections", "The pool's bound.", nil, nil),
		acquires: prometheus.NewDesc("settle_db_pool_acquires_total", "Connections handed out.", nil, nil),
		waits:    prometheus.NewDesc("settle_db_pool_empty_acquires_total", "Acquisitions that had to wait for a free connection.", nil, nil),
		waitSec:  prometheus.NewDesc("settle_db_pool_acquire_wait_seconds_total", "Time spent waiting for connections.", nil, nil),
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
