using System;
using System.Threading.Tasks;
using Newtonsoft.Json.Linq;
using Oam.Bridge.Unity;
using UnityEngine;

/// <summary>
/// The sample scene's script: an innkeeper (an <see cref="OamNpc"/> on the same GameObject, whose
/// inspector declares the tool <c>check_inventory</c>) answers the player, and the game answers the
/// tool from <see cref="aleInStock"/>. Asks <see cref="question"/> on Start; type more in the box.
/// </summary>
public class InnkeeperDemo : MonoBehaviour
{
    public OamNpc innkeeper;
    public string question = "How much ale is left?";
    [Tooltip("What check_inventory reports for ale")]
    public int aleInStock = 3;

    /// <summary>The innkeeper's last answer (also logged).</summary>
    public string lastAnswer = "";
    /// <summary>How many times the model called check_inventory.</summary>
    public int toolCalls;

    string _input = "";
    bool _busy;

    void Awake()
    {
        if (innkeeper == null) innkeeper = GetComponent<OamNpc>();
        _input = question;
        // the tool's name, description and JSON schema are on the OamNpc component (its Tools list);
        // this is the game's side: it runs on the main thread, its result goes back to the model
        innkeeper.RegisterTool("check_inventory", args =>
        {
            toolCalls++;
            string item = (string)args?["item"] ?? "ale";
            return new JObject { ["item"] = item, ["count"] = item == "ale" ? aleInStock : 0 };
        });
        innkeeper.onTextDelta.AddListener(delta => Debug.Log("innkeeper> " + delta));
    }

    async void Start() => await AskAsync(question);

    /// <summary>Asks the innkeeper and keeps the answer in <see cref="lastAnswer"/>.</summary>
    public async Task AskAsync(string line)
    {
        _busy = true;
        try
        {
            lastAnswer = await innkeeper.SayAsync(line);
            Debug.Log("Innkeeper: " + lastAnswer);
        }
        catch (Exception e)
        {
            Debug.LogException(e, this);
        }
        finally
        {
            _busy = false;
        }
    }

    void OnGUI()
    {
        GUILayout.BeginArea(new Rect(10, 10, 480, 240));
        GUILayout.Label("Innkeeper: " + lastAnswer);
        _input = GUILayout.TextField(_input, GUILayout.Width(460));
        if (GUILayout.Button("Ask") && !_busy && !string.IsNullOrEmpty(_input)) _ = AskAsync(_input);
        GUILayout.EndArea();
    }
}
