// Package model is the model-based test: random requests of every kind
// against several replicas, each answer judged against a model of what the
// ledger may hold, the waiting room and the waitlist included.
package model
