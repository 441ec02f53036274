package fairlockotel

// Live returns how many acquisitions o remembers between their events.
func Live(o *Observer) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.live)
}
