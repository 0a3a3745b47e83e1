// Package observe tests what the service tells its operators: request logs,
// metrics after a sale, and traces that follow a purchase.
package observe
