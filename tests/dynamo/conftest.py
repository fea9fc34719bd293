"""The Dynamo tests' fixture: the module's etcd server and frontend."""

import shutil
import tempfile

import pytest

from tests.dynamo.helpers import Infra


@pytest.fixture(scope="module")
def infra():
    tmp = tempfile.mkdtemp(prefix="rlt-dynamo-infra-")
    i = Infra(tmp)
    try:
        yield i
    finally:
        i.close()
        shutil.rmtree(tmp, ignore_errors=True)
