"""The dashboard's fixture database (tests/dashboard_fixture.py, built once a session by the
`dashboard_db` fixture of tests/conftest.py) holds every kind of run and job the pages show."""

from db.store import open_db


def test_the_fixture_holds_every_kind_of_run_and_job(dashboard_db):
    with open_db(dashboard_db, read_only=True) as store:
        counts = store.count_rows()
        statuses = [j["status"] for j in store.list_jobs()]
    # 12 sample bundles + 2 of the KV regression + 8 tiny bundles (the two glm5 test bundles are sample
    # bundles again) + 1 CPU trace; the stepwatch series have no change, the planted one has one event:
    # tok/s and step ms (suspected: one run a commit, ingest.regress.noise) with the whole-pool cast kernel
    # added and the gather-cast kernel removed inside it (counted exactly)
    assert counts["runs"] == 23 and counts["commits"] == 5
    with open_db(dashboard_db, read_only=True) as store:
        changes = store.con.execute("SELECT split_part(metric, chr(31), 1), direction FROM changes "
                                    "ORDER BY metric").fetchall()
    assert changes == [("kernel:calls_per_step:_gather_cast_kernel", "removed"),
                       ("kernel:calls_per_step:void at::native::unrolled_elementwise_kernel<at::native::"
                        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
                        "{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4, "
                        "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
                        "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
                        "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
                        "const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, "
                        "2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
                        "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)", "added"),
                       ("step_ms", "regression"), ("tok_per_s", "regression")]
    assert statuses == ["queued", "running", "failed", "succeeded"]
