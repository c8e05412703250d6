package main

import "context"

func (e *env) runParallel(ctx context.Context, n int) error { return nil }
func (e *env) runContention(ctx context.Context) error      { return nil }
func (e *env) runState() error                              { return nil }
func (e *env) runMemory(n int) error                        { return nil }
