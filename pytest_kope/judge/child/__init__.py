"""The judge's child side, run inside the jail next to untrusted kernel code: the pytest plugin a
judging child loads, the fork server it is forked from, the guards around every kernel call, the
differential replay of recorded calls and the drawn calls that look for inputs a kernel could
recognise. It reports only through signed, typed events (`..protocol`)."""
