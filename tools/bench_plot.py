"""tools/bench-report's latency.svg: the median per N of each family, drawn without a plotting
library (a fresh machine has none)."""
import html
import math
import os
import statistics


def plot(results, ranks_list, path, families, highlight, warnings=()):
    """latency.svg: the median per N of each family, log scales, drawn without a plotting
    library (a fresh machine has none); the legend as wide as its longest name, and the
    report's warnings (a busy machine, targets not judged) above the plot."""
    series = []
    for family in families:
        points = [(n, statistics.median(results.values(family, n))) for n in ranks_list
                  if results.values(family, n)]
        if points:
            series.append((family, points))
    values = [v for _, points in series for _, v in points if v > 0]
    if not values or len(ranks_list) < 1:
        return
    # 11 px sans-serif: about 6.5 px per character, with room for the line sample.
    right = 50 + math.ceil(6.5 * max(len(family) for family, _ in series))
    top = 30 + 16 * len(warnings)
    width, height, left, bottom = 530 + right, 410 + top, 70, 50
    low, high = math.log10(min(values)) - 0.1, math.log10(max(values)) + 0.1
    nlow, nhigh = math.log2(min(ranks_list)), math.log2(max(ranks_list)) or 1

    def x(n):
        span = (nhigh - nlow) or 1
        return left + (math.log2(n) - nlow) / span * (width - left - right)

    def y(v):
        return top + (high - math.log10(v)) / (high - low) * (height - top - bottom)

    colors = ["#d62728", "#ff7f0e", "#bcbd22", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b",
              "#e377c2", "#7f7f7f"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">Barrier latency per episode (us, log scale), '
           f'{os.cpu_count()} vCPUs</text>']
    for index, warning in enumerate(warnings):
        out.append(f'<text x="{left}" y="{36 + 16 * index}" fill="#b00000">Warning: '
                   f'{html.escape(warning)}</text>')
    for decade in range(math.floor(low), math.ceil(high) + 1):
        if low <= decade <= high:
            out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(10 ** decade):.1f}" '
                       f'y2="{y(10 ** decade):.1f}" stroke="#ddd"/>')
            out.append(f'<text x="{left - 6}" y="{y(10 ** decade) + 4:.1f}" text-anchor="end">'
                       f'{10 ** decade:g}</text>')
    for n in ranks_list:
        out.append(f'<text x="{x(n):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{n}</text>')
    out.append(f'<text x="{(left + width - right) / 2:.0f}" y="{height - 12}" '
               f'text-anchor="middle">processes (N)</text>')
    for index, (family, points) in enumerate(series):
        color = colors[index % len(colors)]
        stroke = 2.5 if family == highlight else 1.2
        path_points = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v in points)
        out.append(f'<polyline points="{path_points}" fill="none" stroke="{color}" '
                   f'stroke-width="{stroke}"/>')
        for n, v in points:
            out.append(f'<circle cx="{x(n):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        legend_y = top + 14 * index
        out.append(f'<line x1="{width - right + 12}" x2="{width - right + 30}" y1="{legend_y}" '
                   f'y2="{legend_y}" stroke="{color}" stroke-width="{stroke}"/>')
        out.append(f'<text x="{width - right + 34}" y="{legend_y + 4}">{html.escape(family)}'
                   '</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
