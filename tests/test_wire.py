"""The host takes as an answer only a message that answers its request: a kernel that writes its own
JSON on the channel (a forged "passed" report, a stale answer) is caught, not believed."""

import pytest

from pytest_kope.judge.kernel.wire import Channel, Garbled


@pytest.fixture
def ends():
    host, theirs = Channel.pair()
    server = Channel(theirs)
    yield host, server
    host.close()
    server.close()


def test_an_answer_carries_its_requests_number(ends):
    host, server = ends
    seq = host.request({"op": "call"})
    request, _ = server.recv()
    server.reply(request, {"ok": True})
    assert host.answer(seq) == {"ok": True, "seq": seq}


def test_a_forged_message_answers_no_request(ends):
    host, server = ends
    seq = host.request({"op": "call"})
    server.send({"event": "report", "outcome": "passed"})  # what a forging kernel writes on its fd
    with pytest.raises(Garbled, match="answers no request"):
        host.answer(seq)


def test_a_message_queued_ahead_is_not_the_next_answer(ends):
    host, server = ends
    first = host.request({"op": "call"})
    request, _ = server.recv()
    server.reply(request, {"ok": True})
    server.reply(request, {"ok": True})  # written twice: the second answers nothing asked since
    host.answer(first)
    second = host.request({"op": "call"})
    with pytest.raises(Garbled, match=f"request #{second} was waiting"):
        host.answer(second)
