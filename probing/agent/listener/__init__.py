"""The agent on TCP, for ranks on other nodes: a listener that serves only peers proving the
shared token (acceptor.py), started at most once per process (control.py), where it binds
(address.py), and the job's rendezvous store where a torchrun rank publishes its endpoint
(registry.py).

Off unless asked: PROBING_LISTEN at start, or a `listen` request. Never without a token. This
package's own import is empty, and the agent reads PROBING_LISTEN through address.py alone: the
rest loads only when a listener starts or a request needs it.
"""
