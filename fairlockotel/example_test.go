package fairlockotel_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockotel"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Wiring fairlock to a MeterProvider. A manual reader stands in for an
// exporter here (in production: a periodic reader with an OTLP or Prometheus
// exporter), so that the example can print what was collected.
func Example() {
	ctx := context.Background()
	mr, err := miniredis.Run() // in production: your Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	obs, err := fairlockotel.New(fairlockotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	client, err := fairlock.New(rdb, fairlock.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	for range 3 {
		lease, err := client.Acquire(ctx, fairlock.Request{Name: "reports", Capacity: 1, Permits: 1})
		if err != nil {
			log.Fatal(err)
		}
		_ = lease.Release(ctx)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string // sorted: the SDK does not promise an order
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				sem, _ := dp.Attributes.Value(fairlockotel.SemaphoreKey)
				lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, sem.AsString(), dp.Value))
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				sem, _ := dp.Attributes.Value(fairlockotel.SemaphoreKey)
				lines = append(lines, fmt.Sprintf("%s{%s} count %d, unit %s", m.Name, sem.AsString(), dp.Count, m.Unit))
			}
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// fairlock.acquisitions{reports} 3
	// fairlock.hold.duration{reports} count 3, unit s
	// fairlock.holders{reports} 0
	// fairlock.wait.duration{reports} count 3, unit s
}
