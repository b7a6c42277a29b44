"""The agent on TCP, for ranks on other nodes: a listener that serves only peers proving the
shared token (acceptor.py), started at most once per process (control.py), where it binds
(address.py), the job's rendezvous store where a torchrun rank publishes its endpoint
(registry.py), who the process is in the job (rank.py), and torchrun's launcher, which never
listens from PROBING_LISTEN (launcher.py).

Off unless asked: PROBING_LISTEN at start, or a `listen` request. Never without a token. This
package's own import is empty; the agent reads PROBING_LISTEN through address.py and `hello`
reads rank.py: the rest (and the token's HMAC) loads only when a listener starts or a `listen`
or `endpoints` request needs it.
"""
