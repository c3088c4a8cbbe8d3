"""GET /v1/charges on the sandbox: Stripe's list shape, newest first, paged by starting_after."""

from __future__ import annotations

from tests.providers.sandbox_client import SandboxClient


def test_it_lists_charges_newest_first_in_pages(sandbox: SandboxClient) -> None:
    for n in range(5):
        sandbox.seed_charge(f"ch_list_{n}", 1000 + n)

    seen: list[str] = []
    starting_after = None
    pages = 0
    while True:
        params = {"limit": 2, **({"starting_after": starting_after} if starting_after else {})}
        page = sandbox.get("/v1/charges", **params).json()
        pages += 1
        assert page["object"] == "list" and page["url"] == "/v1/charges"
        seen += [charge["id"] for charge in page["data"]]
        if not page["has_more"]:
            break
        starting_after = page["data"][-1]["id"]

    assert seen == [f"ch_list_{n}" for n in (4, 3, 2, 1, 0)]
    assert pages == 3


def test_a_listed_charge_has_the_fields_an_importer_reads(sandbox: SandboxClient) -> None:
    sandbox.control(
        "POST", "charges", {"id": "ch_meta", "amount": 4200, "currency": "eur", "metadata": {"order_number": "77"}}
    )

    (charge,) = sandbox.get("/v1/charges").json()["data"]

    assert charge["amount_captured"] == 4200
    assert charge["currency"] == "eur"
    assert charge["metadata"] == {"order_number": "77"}
    assert charge["status"] == "succeeded" and charge["captured"] is True
    assert isinstance(charge["created"], int)


def test_it_refuses_an_unknown_cursor_and_unknown_parameters(sandbox: SandboxClient) -> None:
    assert sandbox.get("/v1/charges", starting_after="ch_nope").status_code == 400
    assert sandbox.get("/v1/charges", customer="cus_1").json()["error"]["code"] == "parameter_unknown"
    assert sandbox.get("/v1/charges", limit=101).status_code == 400
