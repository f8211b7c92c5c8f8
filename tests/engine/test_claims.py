"""What a claim reads of the shared state's ready token: which ``run()`` call of which launch
its first worker has set up. A worker still in an earlier call than that one is done with its
call (it waited forever for the later call's claims: a script that stops a gang run, trains,
resumes it and trains again hung under a launch now and then, tests/engine/test_gang.py)."""

from trl_rapidfire.engine.claims import ready_call


def test_the_ready_token_says_which_call_of_which_launch():
    assert ready_call("host:123:abc#2", "host:123:abc") == 2
    assert ready_call("host:123:abc#12", "host:123:abc") == 12
    # Another launch's token, a token without a call, or text that is not one: no call.
    assert ready_call("host:999:xyz#5", "host:123:abc") == 0
    assert ready_call("host:123:abc", "host:123:abc") == 0
    assert ready_call("", "host:123:abc") == 0
    assert ready_call("host:123:abc#-1", "host:123:abc") == 0
    assert ready_call("host:123:abc#1#2", "host:123:abc") == 0
