"""The timeline plot (ppbook.timeline.plot): every block names its microbatch (and, on a rank
holding several stages, its stage) where it fits, no label spills out of its block, and the
legend is in the figure."""

import matplotlib

matplotlib.use("agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from ppbook import timeline, torch_orders  # noqa: E402
from ppbook.planner import schedules, simulate
from ppbook.timeline import Event  # noqa: E402


def drawn_labels(ax) -> list[str]:
    """The texts drawn inside blocks (after the figure is drawn: labels choose at draw time)."""
    return [t.get_text() for t in ax.texts if getattr(t, "fits", False)]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_gpipe_blocks_name_their_microbatches_and_the_legend_is_in_the_figure():
    events = simulate.simulate(schedules.gpipe_order(2, 3), {"F": 1.0, "B": 2.0})
    fig, ax = plt.subplots(figsize=(8, 2))
    timeline.plot(events, ax=ax, time_unit="s")
    fig.canvas.draw()
    assert sorted(drawn_labels(ax)) == sorted(f"{k}{i}" for k in "FB" for i in range(3) for _ in range(2))
    legend = legend_texts(fig)
    assert any(t.startswith("F:") for t in legend) and any(t.startswith("B:") for t in legend)
    assert not any(t.startswith(("I:", "W:")) for t in legend)  # only the kinds drawn
    assert any("idle" in t for t in legend)


def test_v_schedule_blocks_name_their_stage_and_later_chunks_are_tinted():
    events = simulate.simulate(torch_orders.torch_order("ZBVZeroBubble", 2, 2), {"F": 1.0, "I": 1.0, "W": 1.0})
    fig, ax = plt.subplots(figsize=(14, 2.5))
    timeline.plot(events, ax=ax, time_unit="s")
    fig.canvas.draw()
    # wide blocks: torch's notation, stage, kind and microbatch, for every action
    assert sorted(drawn_labels(ax)) == sorted(e.label for e in events)
    assert {e.stage for e in events} == {0, 1, 2, 3}  # rank 0 holds stages 0 and 3, rank 1 stages 1 and 2
    assert any("later stage" in t for t in legend_texts(fig))
    colours = {(e.rank, e.stage): bar.get_facecolor() for e, bar in zip(events, ax.patches)}
    assert colours[(0, 0)] != colours[(0, 3)]


def test_narrow_blocks_fall_back_to_the_microbatch_and_tiny_ones_stay_bare():
    events = simulate.simulate(torch_orders.torch_order("Interleaved1F1B", 2, 4), {"F": 1.0, "B": 2.0})
    fig, ax = plt.subplots(figsize=(3.5, 1.6))
    timeline.plot(events, ax=ax, time_unit="s")
    fig.canvas.draw()
    shown = drawn_labels(ax)
    assert shown and all(t.isdigit() for t in shown)  # one level for the panel: the microbatch alone
    # a block 1/1000 of the step wide holds no label; the others around it keep theirs
    tiny = [Event(0, 0, "F", 0, 0.0, 1.0), Event(0, 0, "F", 1, 1.0, 1.001), Event(0, 0, "B", 0, 1.001, 3.0)]
    fig2, ax2 = plt.subplots(figsize=(6, 1.2))
    timeline.plot(tiny, ax=ax2, time_unit="s")
    fig2.canvas.draw()
    assert "F1" not in drawn_labels(ax2) and "1" not in drawn_labels(ax2)
    assert {"F0", "B0"} <= set(drawn_labels(ax2))


def test_a_short_label_at_a_readable_size_beats_a_long_one_at_the_smallest():
    # chapter 3's idea figure: the batch uncut and in 4 microbatches on one axis; at m = 4 a block is
    # too narrow for "F0" at a readable size, and its panel says "0" rather than "F0" in tiny type
    fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), sharex=True)
    for ax, m in zip(axes, (1, 4)):
        events = simulate.simulate(schedules.gpipe_order(4, m), {"F": 4.0 / m, "B": 8.0 / m})
        timeline.plot(events, ax=ax, time_unit="s")
    fig.tight_layout()
    fig.canvas.draw()
    uncut, cut = ([t for t in ax.texts if t.fits] for ax in axes)
    assert sorted(t.get_text() for t in uncut) == sorted(f"{k}0" for k in "FB" for _ in range(4))
    assert cut and all(t.get_text().isdigit() for t in cut)
    assert min(t.get_fontsize() for t in cut) > timeline._LABEL_SIZES[-1]


def sliver_timeline(width: float):
    """Ten forward blocks of one unit, then one of ``width`` (a sliver such as a noisy host records)."""
    events = [Event(0, 0, "F", i, float(i), i + 1.0) for i in range(10)]
    return events + [Event(0, 0, "F", 10, 10.0, 10.0 + width)]


def test_a_sliver_stays_bare_rather_than_shrink_every_label_of_its_panel():
    for width in (0.25, 0.24, 0.26, 0.23, 0.27, 0.22, 0.28):  # the sliver that holds "10" at 5 points only
        fig, ax = plt.subplots(figsize=(6, 1.2))
        timeline.plot(sliver_timeline(width), ax=ax, time_unit="s", legend=False)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        sliver = ax.texts[-1]
        if sliver._fits(renderer, "10", 5) and not sliver._fits(renderer, "10", 6):
            break
        plt.close(fig)
    else:
        pytest.fail("no sliver width holds its label at 5 points only; adjust the widths tried")
    fig.canvas.draw()
    shown = [t for t in ax.texts if t.fits]
    assert len(shown) == 10 and not sliver.fits  # the ten wide blocks keep theirs, the sliver stays bare
    assert min(t.get_fontsize() for t in shown) > timeline._LABEL_SIZES[-1]


@pytest.mark.parametrize("size", [(8, 2), (3, 1), (1.5, 0.8)])
def test_no_label_spills_out_of_its_block(size):
    events = simulate.simulate(torch_orders.torch_order("Interleaved1F1B", 2, 4), {"F": 1.0, "B": 2.0})
    fig, ax = plt.subplots(figsize=size)
    timeline.plot(events, ax=ax, time_unit="s")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for text in ax.texts:
        if text.fits:
            inner, outer = text.get_window_extent(renderer), text.bar.get_window_extent(renderer)
            assert outer.x0 <= inner.x0 and inner.x1 <= outer.x1, text.get_text()
            assert outer.y0 <= inner.y0 and inner.y1 <= outer.y1, text.get_text()


def test_one_legend_for_a_figure_of_several_timelines_and_labels_can_be_left_out():
    fig, axes = plt.subplots(2, 1, figsize=(8, 3), sharex=True)
    timeline.plot(simulate.simulate(schedules.gpipe_order(2, 2), {"F": 1.0, "B": 2.0}), ax=axes[0], time_unit="s")
    timeline.plot(simulate.simulate(torch_orders.torch_order("ZBVZeroBubble", 2, 2), {"F": 1.0, "I": 1.0, "W": 1.0}),
                  ax=axes[1], time_unit="s", labels=False)
    fig.canvas.draw()
    assert [ax.get_legend() is not None for ax in axes] == [True, False]  # beside the top panel
    legend = legend_texts(fig)
    assert {t.split(":")[0] for t in legend} >= {"F", "B", "I", "W"}  # the kinds of both panels
    assert drawn_labels(axes[0]) and not axes[1].texts
    assert not timeline.cut_bars(fig)


def test_a_followed_microbatch_is_outlined_on_every_rank_and_the_legend_says_which():
    """Issue 50: one microbatch can be followed through a schedule: every block of it, and only
    those, carries the dark outline, on every rank, and the legend names the microbatch."""
    events = simulate.simulate(torch_orders.torch_order("ZBVZeroBubble", 2, 4), {"F": 1.0, "I": 1.0, "W": 1.0})
    fig, ax = plt.subplots(figsize=(10, 2))
    timeline.plot(events, ax=ax, time_unit="s", follow=1)
    fig.canvas.draw()
    outlined = timeline.followed_bars(ax)
    assert outlined == [bar for e, bar in zip(events, ax.patches) if e.microbatch == 1]
    assert {e.rank for e in events if e.microbatch == 1} == {0, 1}
    assert "outlined: microbatch 1" in legend_texts(fig)
    fig2, ax2 = plt.subplots(figsize=(10, 2))
    timeline.plot(events, ax=ax2, time_unit="s")
    assert not timeline.followed_bars(ax2) and not any("outlined" in t for t in legend_texts(fig2))


def test_later_chunks_differ_by_more_than_lightness_and_a_top_legend_frees_the_width():
    """A rank's later stages are hatched as well as lighter; with legend="top" one figure legend sits
    above the panels (none beside them), and larger label sizes can be asked for."""
    events = simulate.simulate(torch_orders.torch_order("Interleaved1F1B", 2, 4), {"F": 1.0, "B": 2.0})
    chunk = timeline._chunk_of(events)
    fig, axes = plt.subplots(2, 1, figsize=(8, 4), layout="constrained")
    for ax in axes:
        timeline.plot(events, ax=ax, time_unit="s", legend="top", label_sizes=(9, 8, 7))
    fig.canvas.draw()
    for e, bar in zip(events, axes[0].patches):
        assert bool(bar.get_hatch()) == (chunk[(e.rank, e.stage)] > 0)
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    assert any("hatched" in t.get_text() for t in fig.legends[0].get_texts())
    assert max(t.get_fontsize() for t in axes[0].texts if t.fits) == 9
    with pytest.raises(ValueError, match="largest first"):
        timeline.plot(events, ax=axes[0], label_sizes=(7, 9))
