// Package waitroom tests the waiting room through the whole system: admission
// in place order until sold out, tokens, the pacer on several replicas, the
// line surviving Redis loss, its events and page, idle rooms, and attacks on
// it.
package waitroom
